"""The agent library: what an agent process imports to attach to its local daemon.

Holds ``Agent`` (asyncio, :mod:`meshd.client.agent`) and ``BlockingAgent`` (a thread around one,
:mod:`meshd.client.blocking`), and the parts an ``Agent`` is made of: batching outgoing messages
(``batching``), running handlers (``handlers``, ``handler_slots``; typed ones: ``contracts``),
what arrives from the daemon (``incoming``), the session with it (``session``), the bounds on
calls in flight (``call_slots``, ``call_deadlines``, ``publish_window``, ``send_pause``) and the
resend hold across a daemon restart (``resend``).

May import: :mod:`meshd.wire`, :mod:`meshd.transport`, :mod:`meshd.util`, :mod:`meshd.errors`.
Never a daemon part (``mesh``, ``delivery``, ``qos1``, ``plugins``, ``discovery``, ``daemon``),
``config`` (pydantic) or ``cli``, not even for typing: an agent process must not pay for the
daemon's dependencies (tests/unit/test_client_imports.py, tests/unit/test_layers.py).
"""

from meshd.client.agent import DEFER, REREGISTER_ATTEMPTS, RESEND_WINDOW, Agent, HandoffResult, Message
from meshd.client.blocking import BlockingAgent
from meshd.client.gather import Gather, GatherReply, GatherSummary
from meshd.client.publish_window import PUBLISH_WINDOW

__all__ = ["DEFER", "PUBLISH_WINDOW", "REREGISTER_ATTEMPTS", "RESEND_WINDOW", "Agent", "BlockingAgent",
           "Gather", "GatherReply", "GatherSummary", "HandoffResult", "Message"]
