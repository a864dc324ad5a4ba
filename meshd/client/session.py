"""The agent's session with its daemon: registering (and applying what the answer says), registering
again after a daemon restart, and the heartbeat loop.

Owns: reading the ``register`` answer (docs/PROTOCOL.md §15.1) into the client's bounds (the
publish window, the calls in flight, the handler slots' parking) and telling the ``Agent`` its
node and the heartbeat interval the daemon asks for; restoring the subscriptions on a new
registration; the periodic sweep of calls that got no answer, and the beat.

Must not touch: sockets (it goes through the ``control`` call it is given), handlers, batching, the
``Agent``'s own state. The ``Agent`` (meshd/client/agent.py) owns one :class:`Session` and gives it,
at construction, the parts whose bounds the answer sets, the table of its subscriptions (its own
dict, shared) and the callbacks below; :func:`heartbeat_loop` gets what it sweeps and calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from meshd.client.call_slots import CallSlots
from meshd.client.handler_slots import HandlerSlots
from meshd.client.publish_window import PublishWindow
from meshd.errors import DaemonUnreachable
from meshd.wire import protocol as P
from meshd.wire.protocol import Kind

__all__ = ["Control", "Session", "heartbeat_loop"]

Control = Callable[[dict[str, Any], Any], Awaitable[Any]]
"""A daemon-addressed call, ``control(header, body)``: sent at once, returns the answer's payload
(the ``Agent``'s ``_control``)."""


class Session:
    """Registering one agent with its daemon, and registering it again."""

    def __init__(self, *, control: Control, hello: Callable[[], dict[str, Any]],
                 registered: Callable[[str | None, str | None, float | None], None],
                 window: PublishWindow, slots: HandlerSlots, calls: CallSlots,
                 topics: Mapping[str, bool],
                 credit: Callable[[object], None] | None = None) -> None:
        """``hello()``: the register body (name, capabilities, metadata); ``registered(node,
        node_name, beat)``: what the answer said, ``beat`` the daemon's ``heartbeat_interval``
        (None if it named none); ``topics``: the agent's subscriptions, topic -> durable."""
        self._control = control
        self._hello = hello
        self._registered = registered
        self._window = window
        self._slots = slots
        self._calls = calls
        self._topics = topics
        #: what the register answer's ``credit`` is handed to (the Agent's Incoming)
        self.credit = credit

    async def register(self) -> None:
        """Register the agent's name and fit its bounds to what the daemon's answer says."""
        info = await self._control({P.KIND: Kind.REGISTER}, self._hello())
        if isinstance(info, dict):
            beat = info.get("heartbeat_interval")  # PROTOCOL.md §8.2: beat at least this often
            if not isinstance(beat, (int, float)) or isinstance(beat, bool) or beat <= 0:
                beat = None
            self._registered(info.get("node"), info.get("node_name"),
                             float(beat) if beat is not None else None)
            self._window.fit_daemon(info.get("in_flight_max"))
            self._slots.fit_daemon(info.get("inbox_cap"))
            self._calls.fit_daemon(info.get("in_flight_max"), self._window.size)
            if self.credit is not None:
                self.credit(info.get("credit"))

    async def reregister(self) -> None:
        """Register again and restore the subscriptions (``ResendHold.reregister`` retries it)."""
        await self.register()
        for topic, durable in list(self._topics.items()):
            header: dict[str, Any] = {P.KIND: Kind.SUBSCRIBE, P.TOPIC: topic}
            if durable:
                header[P.QOS] = 1
            await self._control(header, None)


async def heartbeat_loop(*, interval: Callable[[], float], running: Callable[[], bool],
                         expiring: Mapping[str, float], expire: Callable[[str], None],
                         beat: Callable[[], None]) -> None:
    """While ``running()``, every ``interval()`` seconds: ``expire`` each call in ``expiring`` (msg
    id -> monotonic deadline, the ``Agent``'s dict) whose deadline passed, then ``beat()`` (the
    ``Agent``'s, which beats unless ``auto_heartbeat`` is off). Ends when a beat finds the embedded
    node stopped (DaemonUnreachable)."""
    while running():
        await asyncio.sleep(interval())
        now = time.monotonic()
        for msg_id, deadline in list(expiring.items()):
            if deadline < now:
                expire(msg_id)
        try:
            beat()
        except DaemonUnreachable:  # an embedded node that stopped: calls raise it too
            return
