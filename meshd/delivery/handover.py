"""Handing local agents over when the daemon stops, so no qos-0 send is lost in silence.

A message an agent writes to the local socket after the daemon's last read vanishes with the
socket, and so does an answer the daemon could not hand to the agent before it closed. So the
stop runs in this order (docs/DELIVERY.md, "qos 0 across a restart of the sender's own daemon"):

1. :meth:`AgentHandover.begin`, when the shutdown begins: every registered agent gets a
   ``DAEMON_STOPPING`` notice (no ``corr``). A client then stops sending (it holds its qos-0
   sends) and registers again; this daemon refuses that ``register`` with ``DAEMON_STOPPING``
   (:meth:`AgentHandover.answered`): the socket is a FIFO pipe both ways, so everything that
   agent sent before has been read (qos-0 messages are refused ``NOT_REGISTERED`` while
   stopping, and the client holds those too), and once the client registers a second time it
   has read that refusal, hence every refusal before it: the connection has *answered*.
2. :meth:`AgentHandover.finish`, at the sockets step: wait until every notified agent that is
   still registered has answered (at most ``STOP_GRACE`` seconds), read what is left on the
   socket (the last drain), and wait until the answer lane has handed over every answer (at
   most ``STOP_GRACE`` more). Then node.py closes the socket.

When the next daemon starts, agents register again before it has met its peers, and what they
held would bounce ``NO_SUCH_AGENT`` or ``PEER_UNREACHABLE``. So while the daemon starts (from the
sockets step, :meth:`AgentHandover.hold_registrations`, until READY and every peer it knows is
online both ways or gone (:func:`peers_settled`), at most ``START_SETTLE`` seconds), a
``register`` waits (:meth:`AgentHandover.defer`) and is answered then
(:meth:`AgentHandover.open_registrations`); the daemons' own system agent registers at once.

Owns: the set of notified connections (at most the registered agents), the two bounded waits,
and the registrations deferred during start-up (at most ``DEFER_MAX``; past it, at once).
Must not touch: routing decisions (drained frames go to the router's ``on_agent``), the agent
records (it reads the directory), peers (it reads their states), the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import zmq

from meshd.mesh.directory import Directory
from meshd.mesh.liveness import PeerState
from meshd.wire import protocol as P
from meshd.wire.system_names import SYSTEM_PREFIX

if TYPE_CHECKING:
    from meshd.delivery.local_agents import AgentLink

__all__ = ["START_SETTLE", "STOP_GRACE", "AgentHandover", "peers_settled"]

log = logging.getLogger("meshd.node")

STOP_GRACE = 1.0
"""Seconds a stopping daemon waits for its agents to answer the notice, and again for the answers
it owes them to leave (a client whose loop is blocked longer than that may lose what it sends)."""
STOP_RETRY_AFTER = 0.2
"""The ``retry_after`` of ``DAEMON_STOPPING``: how soon a client tries to register again."""
START_SETTLE = 2.0
"""Seconds after the agent socket is bound at most before registrations are answered (normally
they are at READY; a plugin that registers an agent during start-up waits no longer than this)."""
ANSWER_ROUNDS = 2
"""``register`` messages that make a connection answered: the second proves the client read the
refusal of the first, and so every answer queued before it."""
DEFER_MAX = 1000
"""Registrations kept for READY at most; past it a ``register`` is answered at once."""
DRAIN_MAX = 100_000
"""Messages read from the agent socket in the last drain at most."""
_POLL = 0.005


def peers_settled(peers: Iterable[Any]) -> bool:
    """Every peer known (``meshd.mesh.peers.Peer`` records) is online both ways, or offline with no
    connection up: none half-way (greeted but one-way or stale, or connected and not greeted)."""
    return all(p.state is PeerState.ONLINE or (p.state is PeerState.OFFLINE and not p.link_up)
               for p in peers)


class AgentHandover:
    """The stopping daemon's hand-over of its local agents (see the module docstring)."""

    def __init__(self, link: AgentLink, directory: Directory, stats: Counter[str],
                 register: Callable[[bytes, Any, list[bytes]], None], *,
                 settled: Callable[[], bool] | None = None,
                 stays_attached: Callable[[bytes], bool] | None = None) -> None:
        """``settled``: whether start-up may answer registrations before ``START_SETTLE`` (the
        peers are settled); ``stays_attached``: connections never told to go elsewhere (an embedded
        node's in-process agents stop with it)."""
        self.link = link
        self.directory = directory
        self.stats = stats
        #: Registers a connection (``rid``, ``id``, frames): LocalAgents' register path.
        self.register = register
        self.notified: set[bytes] = set()
        self._answered: Counter[bytes] = Counter()  # rid -> registers while stopping
        self.starting = False
        self._deferred: list[tuple[bytes, Any, list[bytes]]] = []
        self._settle: asyncio.TimerHandle | None = None
        self._check: asyncio.TimerHandle | None = None
        self._settled = settled
        self.stays_attached: Callable[[bytes], bool] = stays_attached or (lambda rid: False)

    # ------------------------------------------------------------------ start-up

    def hold_registrations(self, settle: float = START_SETTLE) -> None:
        """The daemon starts: answer registrations at READY once ``settled()`` (the peers), or
        ``settle`` seconds from now, whichever is first."""
        self.starting = True
        self._settle = asyncio.get_running_loop().call_later(settle, self.open_registrations)

    def ready(self) -> None:
        """READY: open registrations once the peers are settled (checked every 20 ms; the settle
        time bounds it)."""
        self._check = None
        if not self.starting:
            return
        if self._settled is None or self._settled():
            self.open_registrations()
            return
        self._check = asyncio.get_running_loop().call_later(4 * _POLL, self.ready)

    def defer(self, rid: bytes, msg_id: Any, frames: list[bytes]) -> bool:
        """While starting, keep a ``register`` for :meth:`open_registrations` (True). The system
        agent (its name is the daemons' own) and any past ``DEFER_MAX`` register at once."""
        if not self.starting or len(self._deferred) >= DEFER_MAX:
            return False
        with contextlib.suppress(P.FrameError):
            body = P.unpack_body(frames[3], 64 * 1024)
            if isinstance(body, dict) and str(body.get("name", "")).startswith(SYSTEM_PREFIX):
                return False
        self._deferred.append((rid, msg_id, frames))
        self.stats["registrations_deferred"] += 1
        return True

    def _stop_timers(self) -> None:
        for timer in (self._settle, self._check):
            if timer is not None:
                timer.cancel()
        self._settle = self._check = None

    def open_registrations(self) -> None:
        """READY and settled (or the settle time passed): answer the deferred registrations, in
        order."""
        self.starting = False
        self._stop_timers()
        deferred, self._deferred = self._deferred, []
        for rid, msg_id, frames in deferred:
            self.register(rid, msg_id, frames)

    # ------------------------------------------------------------------ shutdown

    def begin(self) -> None:
        """Tell every registered agent that this daemon is stopping (and refuse the registrations
        still deferred, if it stops before READY)."""
        self._stop_timers()
        self.starting = False
        deferred, self._deferred = self._deferred, []
        for rid, msg_id, _ in deferred:
            self.answered(rid, msg_id)
        for rid in list(self.directory.local_by_rid):
            if self.stays_attached(rid):
                continue
            self.notified.add(rid)
            self.link.send_error(rid, None, P.ErrorCode.DAEMON_STOPPING,
                                 "the daemon is stopping: hold qos-0 sends and register again with the "
                                 "next one", retry_after=STOP_RETRY_AFTER)
        self.stats["stop_notices"] += len(self.notified)

    def answered(self, rid: bytes, msg_id: Any) -> None:
        """A ``register`` while stopping: what that connection sent before is read. Refuse it."""
        self._answered[rid] += 1
        self.link.send_error(rid, msg_id, P.ErrorCode.DAEMON_STOPPING,
                             "the daemon is stopping: register again with the next one",
                             retry_after=STOP_RETRY_AFTER)

    def unanswered(self) -> list[bytes]:
        """Notified connections still registered that have not answered yet."""
        return [rid for rid in self.notified
                if self._answered[rid] < ANSWER_ROUNDS and rid in self.directory.local_by_rid]

    async def finish(self, sock: zmq.Socket[Any] | None, on_agent: Callable[[list[bytes]], None],
                     grace: float = STOP_GRACE) -> None:
        """Wait for the answers to the notice, read the socket dry, hand the answers over."""
        end = time.monotonic() + grace
        # Answers and removals come from other parts (the register path, the directory): polled.
        while self.unanswered() and time.monotonic() < end:  # noqa: ASYNC110 - bounded by grace
            await asyncio.sleep(_POLL)
        late = self.unanswered()
        if late:
            self.stats["stop_unanswered"] += len(late)
            log.warning("%d agent(s) did not answer the stop notice within %.1f s; what they send "
                        "from now on may be lost", len(late), grace)
        if sock is None:
            return
        drained = self.drain(sock, on_agent)
        if drained:
            log.info("routed %d message(s) agents sent just before the shutdown", drained)
        end = time.monotonic() + grace
        while not self.link.backlog_empty and time.monotonic() < end:  # noqa: ASYNC110 - bounded
            await asyncio.sleep(_POLL)
        if not self.link.backlog_empty:
            self.stats["stop_answers_undelivered"] += 1
            log.warning("answers to local agents still waited after %.1f s; closing anyway", grace)

    @staticmethod
    def drain(sock: zmq.Socket[Any], on_agent: Callable[[list[bytes]], None]) -> int:
        """Route what agents sent and we have not read yet (at most ``DRAIN_MAX`` messages)."""
        drained = 0
        with contextlib.suppress(zmq.ZMQError):
            while drained < DRAIN_MAX:
                frames = sock.recv_multipart(zmq.NOBLOCK)
                drained += 1
                try:
                    on_agent(frames)
                except Exception:
                    log.exception("routing a message drained at shutdown failed")
        return drained
