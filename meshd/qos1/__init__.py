"""At-least-once delivery (qos 1): the sans-I/O machine, its SQLite store and its bounds.

Holds :class:`~meshd.qos1.machine.Qos1` (events in, actions out, clocks injected), the outbox and
seen-set in SQLite (``store``) and what the outbox may hold (``bounds``). Who performs the
machine's actions lives in :mod:`meshd.delivery.qos1_driver`.

May import: ``wire``, ``util``, ``errors``. No sockets, no event loop, nothing above.
"""

from meshd.qos1.bounds import OutboxBounds
from meshd.qos1.machine import Qos1
from meshd.qos1.store import DeliveryStore

__all__ = ["DeliveryStore", "OutboxBounds", "Qos1"]
