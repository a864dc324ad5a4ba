"""The embedded node: a whole meshd node inside the agent's own process, with no hop to it.

For a host with one agent process: ``EmbeddedNode`` *is* meshd's :class:`~meshd.daemon.node.Node` (same
settings model, same ``START_STEPS``: identity, CURVE and trust, the qos-1 store, the mesh
sockets, zeroconf, timers, plugins, the system agent), run in the agent's asyncio loop. Peers see
an ordinary daemon: same HELLO, same zeroconf record, same keys. It also keeps its ipc agent
socket, so ``meshctl``, the system agent and spawned agents attach as usual.

What it adds is the in-process attachment: ``Agent(name, embedded=node)`` (or
``node.agent(name)``) talks to the node through an :class:`InProcessConnection` instead of a
DEALER on the ipc socket. The agent's frame sets go straight to ``Router.on_agent``, in the
agent's call (no socket, no copy, no loop turn); the node's frame sets to the agent go through a
bounded per-connection queue drained by ``call_soon`` (never re-entrant, like a socket), or, once
the agent's ``connect`` returned, at the end of the node's drain that queued them; except a
routed reply from the node's own events, handed over at once (``hand_over``: it only resolves a
future, saving a loop turn per round trip). The
node's side of it is :class:`AgentSockets`, which stands where the ipc ROUTER stood for
``AgentLink``, ``Router`` and ``LocalAgents``, with the ROUTER's contract: ``zmq.Again`` when a
connection's queue is full (INBOX_FULL, the answer lane's backlog), ``zmq.ZMQError``
(EHOSTUNREACH) for a connection that is gone (ROUTER_MANDATORY); any other routing id goes to the
ipc ROUTER unchanged.

Owns: the in-process connections, their routing ids and queues, and the embedded node's
start/stop as an async context manager. Must not touch: routing, delivery or peer logic (it is
the node's, unchanged), nor the client's (``meshd.client`` uses only ``attach``). Imported only
when used: ``import meshd`` stays the light client.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections import Counter, deque
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import zmq

from meshd import transport
from meshd.client import Agent
from meshd.config.settings import Settings, load_settings
from meshd.daemon.node import Node
from meshd.errors import DaemonUnreachable

__all__ = ["AgentSockets", "EmbeddedNode", "InProcessConnection", "embedded"]

log = logging.getLogger("meshd.embedded")

DELIVER_BUDGET = 256
"""Frame sets handed to one in-process agent per loop turn; the rest wait for the next turn, so a
busy agent cannot starve the node's sockets and timers."""

ROUTE_BUDGET = 16
"""Frame sets (a batch is one) an in-process agent may hand the node per loop turn; past it the
connection says ``zmq.Again`` like a DEALER at its high-water mark, so the client queues (and
batches) and a plain ``await send(...)`` loop yields to the loop: the node's heartbeats, acks and
replies keep running in the same loop."""

FrameHandler = Callable[[list[bytes]], None]


class InProcessConnection:
    """One agent's in-process connection. The agent's side quacks like its DEALER
    (``send_multipart``, ``closed``, ``close``); the node's side is :meth:`put`."""

    def __init__(self, sockets: AgentSockets, rid: bytes, on_frames: FrameHandler,
                 loop: asyncio.AbstractEventLoop, capacity: int) -> None:
        self.rid = rid
        self.capacity = capacity
        self.closed = False
        self._sockets = sockets
        self._on_frames = on_frames
        self._loop = loop
        self._queue: deque[list[bytes]] = deque()
        self._scheduled = False
        self._routed = 0  # frame sets handed to the node in this loop turn
        self.paused = False  # the agent's handlers are all busy: the queue fills, then Again
        #: The agent's ``connect`` returned (its code registers handlers before it next awaits):
        #: from then on frame sets the node queues in its own drain reach it at that drain's end.
        self.connected = False

    def __len__(self) -> int:
        """Frame sets queued for the agent and not handed to it yet."""
        return len(self._queue)

    # ------------------------------------------------------------------ the agent's side

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        """The agent sends ``[signature, header, payload]``: the node routes it now."""
        if self.closed:  # the node stopped (or the agent closed): a typed error, not a zmq one
            raise DaemonUnreachable("the embedded node this agent was attached to has stopped")
        routed = self._routed
        if routed >= ROUTE_BUDGET:
            raise zmq.Again()  # the client's SendQueue retries on the next loop turn
        if not routed and self._sockets.peers_full():
            # Once per turn: a peer queue at its high-water mark would refuse what we route
            # (PEER_UNREACHABLE); wait for it as a full DEALER makes its sender wait.
            self._sockets.stats["embedded_peer_waits"] += 1
            raise zmq.Again()
        self._routed = routed + 1
        self._sockets.from_agent(self.rid, frames)
        if not routed:  # after the routing, not before: the frame set is on its way ~1 us sooner
            self._loop.call_soon(self._new_turn)

    def _new_turn(self) -> None:
        self._routed = 0

    def close(self, linger: int | None = None) -> None:
        """The agent left: the node forgets this connection (and probes, as for a closed socket)."""
        if not self.closed:
            self.closed = True
            self._queue.clear()
            self._sockets.detach(self.rid)

    def pause(self) -> None:
        """Stop handing frame sets to the agent (its handler slots are full, meshd/client/handler_slots.py):
        they wait in the queue, and past ``capacity`` the node says INBOX_FULL, as over ipc."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        if self._queue and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._deliver)

    # ------------------------------------------------------------------ the node's side

    def put(self, frames: list[bytes]) -> None:
        """Queue ``[signature, header, payload]`` for the agent. Raises ``zmq.Again`` when the
        queue is full, ``zmq.ZMQError`` when the agent is gone (the ROUTER's contract)."""
        if self.closed:
            raise zmq.ZMQError(zmq.EHOSTUNREACH)
        if len(self._queue) >= self.capacity:
            raise zmq.Again()
        self._queue.append(frames)
        if not self._scheduled and not self.paused:
            self._scheduled = True
            sockets = self._sockets
            if self.connected and not sockets.in_agent_call:
                # The node's own event (a peer's frames drained from the mesh, a timer): at the end
                # of the drain under way, when the node's routing is off the stack (Reactor.soon),
                # instead of one more loop turn; outside a drain, on the next turn as before.
                sockets.soon(self._deliver)
            else:  # an agent's call is on the stack, or its handlers may not be registered yet
                self._loop.call_soon(self._deliver)

    def hand_over(self, frames: list[bytes]) -> bool:
        """Hand a reply to the agent now, in the node's call, instead of on the next loop turn.

        Only when nothing waits before it (FIFO), the agent reads, and no agent's call is on the
        stack (``AgentSockets.in_agent_call``): the node's own events (a peer's frames drained
        from the mesh, a timer) only. A reply only resolves the awaiting call's future (its task
        resumes on the next turn as always), so no handler runs inside the node's routing.
        False: the caller queues it with :meth:`put`."""
        if self._queue or self.paused or self.closed or self._sockets.in_agent_call:
            return False
        try:
            self._on_frames(frames)
        except Exception:
            log.exception("in-process agent: handling a frame set raised; dropped")
        return True

    def _deliver(self) -> None:
        self._scheduled = False
        queue, on_frames = self._queue, self._on_frames
        for _ in range(DELIVER_BUDGET):
            if not queue or self.closed or self.paused:
                return
            try:
                on_frames(queue.popleft())
            except Exception:
                log.exception("in-process agent: handling a frame set raised; dropped")
        if queue and not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._deliver)


class AgentSockets:
    """Where the node's agent ROUTER stood: in-process connections by routing id, and the ipc
    ROUTER for every other id. ``AgentLink``, ``Router`` and ``LocalAgents`` send through it."""

    def __init__(self, router: zmq.Socket[Any], *, capacity: int, loop: asyncio.AbstractEventLoop,
                 on_agent: FrameHandler | None = None, on_detached: Callable[[], None] | None = None,
                 peers_full: Callable[[], bool] | None = None, stats: Counter[str] | None = None,
                 soon: Callable[[Callable[[], None]], object] | None = None) -> None:
        """``on_agent``: where in-process agents' frame sets go (the node's ``Router.on_agent``);
        ``on_detached``: a connection went away (the node probes its agents); ``peers_full``:
        whether a peer's DEALER is at its high-water mark; ``soon``: how the node schedules work
        for the end of its drain under way (its reactor's ``soon``)."""
        self.router = router
        self.capacity = capacity
        self.on_agent: FrameHandler | None = on_agent  # None once the node stopped
        self.on_detached = on_detached
        self.peers_full: Callable[[], bool] = peers_full or (lambda: False)
        self.stats: Counter[str] = stats if stats is not None else Counter()
        self.dropped = 0  # frame sets an agent sent after the node stopped
        #: Inside an in-process agent's call into the node (``from_agent``): nothing is handed over.
        self.in_agent_call = 0
        self.soon: Callable[[Callable[[], None]], object] = soon or loop.call_soon
        #: Sent on the ipc ROUTER since the last kick (a send there can swallow its read edge).
        self.router_sent = False
        self._loop = loop
        self._conns: dict[bytes, InProcessConnection] = {}
        self._seq = itertools.count(1)
        self._prefix = b"\x00emb" + os.urandom(4)

    @property
    def closed(self) -> bool:
        return self.router.closed

    def __contains__(self, rid: object) -> bool:
        return rid in self._conns

    def __len__(self) -> int:
        """In-process connections attached now."""
        return len(self._conns)

    def attach(self, on_frames: FrameHandler) -> InProcessConnection:
        # 12 bytes: never a ROUTER-made id (5 bytes); an ipc client claiming one is refused
        # (EmbeddedNode._on_ipc_agent).
        rid = self._prefix + next(self._seq).to_bytes(4, "big")
        conn = InProcessConnection(self, rid, on_frames, self._loop, self.capacity)
        self._conns[rid] = conn
        return conn

    def detach(self, rid: bytes) -> None:
        conn = self._conns.pop(rid, None)
        if conn is not None:
            conn.close()
            if self.on_detached is not None:
                self.on_detached()

    def from_agent(self, rid: bytes, frames: list[bytes]) -> None:
        on_agent = self.on_agent
        if on_agent is None:
            self.dropped += 1
            return
        self.in_agent_call += 1
        try:
            on_agent([rid, *frames])
        except Exception:
            log.exception("routing a frame set from in-process agent failed; dropped")
        finally:
            self.in_agent_call -= 1

    def hand_over(self, frames: list[bytes]) -> bool:
        """``[rid, signature, header, payload]``, a reply: to an in-process agent at once if it can
        take it (:meth:`InProcessConnection.hand_over`); False for the usual path."""
        conn = self._conns.get(frames[0])
        return conn is not None and conn.hand_over(frames[1:])

    def send_multipart(self, frames: list[bytes], flags: int = 0) -> None:
        """``[rid, signature, header, payload]`` to an in-process agent or over the ipc ROUTER."""
        conn = self._conns.get(frames[0])
        if conn is None:
            self.router_sent = True  # the reactor's next kick of us re-checks the ROUTER
            self.router.send_multipart(frames, flags)
        else:
            conn.put(frames[1:])

    def close(self) -> None:
        """The node stops: every in-process connection is gone for the node."""
        self.on_agent = None
        for conn in list(self._conns.values()):
            conn.closed = True
        self._conns.clear()


class _Reactor(transport.Reactor):
    """The node's reactor; a kick of the :class:`AgentSockets` re-checks the ipc ROUTER.
    ``sockets``: the node's in-process sockets once its sockets step built them."""

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 sockets: Callable[[], AgentSockets | None] = lambda: None) -> None:
        super().__init__(loop)
        self.sockets = sockets

    def kick(self, sock: zmq.Socket[Any]) -> None:
        sockets, target = self.sockets(), cast(object, sock)
        if sockets is not None and target is sockets:
            if not sockets.router_sent:
                return  # only in-process connections were sent to: no read edge to re-check
            sockets.router_sent = False
            sock = sockets.router
        super().kick(sock)


class EmbeddedNode(Node):
    """A meshd node in this process, for its agents to attach to without a hop.

    ::

        async with EmbeddedNode.from_config(name="lab-1") as node:
            async with node.agent("planner") as me:
                reply = await me.request("researcher", "verify", {"claim": "x"})

    It is a :class:`~meshd.daemon.node.Node`: ``start``/``stop`` (or ``async with``), the same settings
    (:meth:`from_config` reads the TOML file, ``MESHD_*`` and keyword overrides like ``meshd
    run``). Run it in the loop its agents use; a handler that blocks the loop blocks the node
    too (peers see it stale after ``stale_after``).
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.agent_sockets: AgentSockets | None = None
        self._agent_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_config(cls, config_file: str | Path | None = None, *, environ: Mapping[str, str] | None = None,
                    **overrides: Any) -> EmbeddedNode:
        """Settings as ``meshd run`` builds them: defaults < TOML file < ``MESHD_*`` < overrides
        (field names of ``meshd.config.Settings``). Raises ConfigError naming a bad key."""
        path = Path(config_file) if config_file is not None else None
        return cls(load_settings(path, overrides=overrides, environ=environ))

    async def __aenter__(self) -> EmbeddedNode:
        try:
            await self.start()
        except BaseException:
            await self.stop()  # release what a half-finished start bound
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    def agent(self, name: str, **kwargs: Any) -> Agent:
        """An :class:`~meshd.Agent` attached in-process (the same arguments, no ``socket``)."""
        return Agent(name, embedded=self, **kwargs)

    def attach(self, on_frames: FrameHandler) -> zmq.Socket[Any]:
        """A new in-process connection for an ``Agent`` (``Agent.connect`` calls this): frame sets
        for it go to ``on_frames``; it takes the place of the agent's DEALER."""
        if self.agent_sockets is None or self._stopping:
            raise DaemonUnreachable("the embedded node is not running (start it first)")
        if asyncio.get_running_loop() is not self._agent_loop:
            raise RuntimeError("attach the agent from the embedded node's own event loop")
        # It quacks like the DEALER the client's SendQueue drives: send_multipart, closed, close.
        return cast("zmq.Socket[Any]", self.agent_sockets.attach(on_frames))

    # ------------------------------------------------------------------ Node's steps, extended

    async def _start_identity(self) -> None:
        await super()._start_identity()
        self._agent_loop = asyncio.get_running_loop()
        self._reactor = _Reactor(self._agent_loop, sockets=lambda: self.agent_sockets)

    def _build(self, agents_sock: zmq.Socket[Any], reactor: transport.Reactor,
               stays_attached: Callable[[bytes], bool] | None = None) -> None:
        # As deep as the ipc path lets frame sets wait: the ROUTER's SNDHWM (inbox_cap) plus the
        # agent DEALER's RCVHWM. Past it the node says INBOX_FULL, as it would over ipc.
        assert self._agent_loop is not None
        peers = self.peer_table

        def peers_full() -> bool:
            return any(p.dealer is not None and not p.dealer.closed
                       and not int(p.dealer.getsockopt(zmq.EVENTS)) & zmq.POLLOUT for p in peers)
        # The router and agent control are built below (super()._build), after these sockets:
        # their callbacks go through the node, as the peer table's PeerEvents do.
        sockets = AgentSockets(agents_sock, capacity=max(self.settings.inbox_cap, 1) + transport.AGENT_HWM,
                               loop=self._agent_loop, on_agent=self._from_in_process,
                               on_detached=self._in_process_detached, peers_full=peers_full,
                               stats=self.stats, soon=reactor.soon)
        self.agent_sockets = sockets
        # In-process agents are not told to re-register elsewhere: no node takes over from this one.
        super()._build(cast("zmq.Socket[Any]", sockets), reactor, stays_attached=sockets.__contains__)

    def _from_in_process(self, frames: list[bytes]) -> None:
        self.routing.on_agent(frames)

    def _in_process_detached(self) -> None:
        self.local_agents.probe()

    async def _start_sockets(self) -> None:
        await super()._start_sockets()
        reactor, sock = self._reactor, self.agents_sock
        assert reactor is not None and sock is not None
        reactor.remove(sock)
        reactor.add(sock, self._on_ipc_agent)

    def _on_ipc_agent(self, frames: list[bytes]) -> None:
        """The ipc socket's traffic, minus any that claims an in-process agent's routing id."""
        sockets = self.agent_sockets
        if sockets is not None and frames and frames[0] in sockets:
            self.stats["embedded_rid_refused"] += 1
            return
        self.routing.on_agent(frames)

    async def _stop_sockets(self) -> None:
        if self.agent_sockets is not None:
            self.agent_sockets.close()
        await super()._stop_sockets()

    def node_info(self) -> dict[str, Any]:
        info = super().node_info()
        sockets = self.agent_sockets
        info["embedded"] = {"in_process_agents": len(sockets) if sockets is not None else 0}
        return info


def embedded(config_file: str | Path | None = None, **overrides: Any) -> EmbeddedNode:
    """An :class:`EmbeddedNode` built like ``meshd run`` builds its settings; ``async with`` it."""
    return EmbeddedNode.from_config(config_file, **overrides)
