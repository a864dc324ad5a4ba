"""ZeroMQ sockets and the reactor that drives them from the asyncio loop.

Everything that touches a zmq socket's options lives here, so a reader can see in one place
which limits every socket has (bounded linger, high-water marks, ZMTP heartbeats, frame size).

The routing path does not pay an asyncio future per message: ``Reactor`` hooks each socket's
edge-triggered ``FD`` with ``loop.add_reader`` and drains it with NOBLOCK until it is empty. Because
the FD is edge-triggered, a send on a socket can swallow the read edge; ``Reactor.kick`` re-checks
``ZMQ_EVENTS`` for sockets that were sent on (see ../shared/DESIGN.md, Performance rules).

The daemon and the agent client share this pump: the client reads its DEALER through a
``Reactor`` too, and writes through a ``SendQueue`` (NOBLOCK sends; what the high-water mark
refuses waits in order and is retried each loop turn). Nothing here parses a frame.
Owns: socket construction and options, and the ``Reactor``. It must not parse frames or know
what a message means: callbacks it drives (routing.py, peers.py, security.py) do that.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple

import zmq
import zmq.backend

from meshd.util.logonce import LogOnce

log = logging.getLogger("meshd.transport")
_quiet = LogOnce(log)  # a handler failing on hostile input: one traceback per cause, not per message

LINGER_MS = 200
"""Bounded linger on every socket: the default (-1) makes context termination hang forever."""

RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 2000
MESH_HWM = 10_000
DRAIN_BUDGET = 256
"""Messages handled per socket per loop iteration before yielding to timers and other sockets."""
DRAIN_SECONDS = 0.005
"""...or this much time, whichever comes first (a batch fanned out to many agents is slow)."""

Handler = Callable[[list[Any]], None]
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_send_frame = zmq.backend.Socket.send
"""pyzmq's compiled one-frame send, under its Python wrapper ``zmq.Socket.send``."""

FrameSender = Callable[[list[Any]], None]


def send_frames(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    """``sock.send_multipart(frames, zmq.NOBLOCK)``, without pyzmq's Python layer.

    ``send_multipart`` type-checks every frame, then goes through ``Socket.send`` per frame and
    builds ``zmq.SNDMORE | flags`` (an enum.Flag operation) for each: ~3.9 us for a 4-frame
    message, against ~0.7 us here with plain int flags (bench/README.md, "Where the time goes").
    Same semantics: ``zmq.Again`` at the high-water mark before anything is queued (ZeroMQ takes
    the rest of a multipart message once it took its first frame), ``TypeError`` for a frame that
    is not a buffer.
    """
    last = len(frames) - 1
    for i in range(last):
        _send_frame(sock, frames[i], _NOBLOCK_MORE)
    _send_frame(sock, frames[last], _NOBLOCK)


_recv_frame = zmq.backend.Socket.recv
"""pyzmq's compiled one-frame receive (``copy=False`` gives a ``zmq.Frame`` that knows ``more``)."""


def recv_frames(sock: zmq.Socket[Any]) -> list[bytes]:
    """``sock.recv_multipart(zmq.NOBLOCK)`` (copied frames) in ~1.9 us instead of ~3.1 for 4 frames:
    ``recv_multipart`` asks ``getsockopt(RCVMORE)`` after every frame (~1 us each, an enum lookup
    inside pyzmq); the received ``zmq.Frame`` carries that flag already. ``zmq.Again`` when nothing
    waits; a multipart message arrives whole or not at all."""
    frame = _recv_frame(sock, _NOBLOCK, False)
    frames = [frame.bytes]
    while frame.more:
        frame = _recv_frame(sock, _NOBLOCK, False)
        frames.append(frame.bytes)
    return frames


def frame_sender(sock: Any) -> FrameSender:
    """A NOBLOCK multipart sender for ``sock``: :func:`send_frames` for a zmq socket, else its own
    ``send_multipart`` (the embedded node's in-process stand-ins, meshd/daemon/embedded.py)."""
    if isinstance(sock, zmq.Socket):
        return partial(send_frames, sock)
    return partial(sock.send_multipart, flags=zmq.NOBLOCK)


@dataclass(frozen=True)
class Curve:
    """This node's CURVE keypair (z85). None everywhere means plaintext (--insecure)."""

    public: str
    secret: str


def curve_server(sock: zmq.Socket[Any], curve: Curve | None) -> None:
    """CURVE server with ZAP enforced: without a running authenticator, nobody gets in."""
    if curve is None:
        return
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret.encode())
    sock.setsockopt(zmq.ZAP_DOMAIN, b"meshd")
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def curve_client(sock: zmq.Socket[Any], curve: Curve | None, server_key: str | None) -> None:
    """CURVE client pinned to the server's key: we only ever talk to the node we meant."""
    if curve is None:
        return
    if not server_key:
        raise ValueError("a CURVE client needs the server's public key")
    sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret.encode())


def _common(sock: zmq.Socket[Any]) -> None:
    sock.setsockopt(zmq.LINGER, LINGER_MS)


class ZmtpHeartbeat(NamedTuple):
    """ZMTP heartbeats of a mesh socket, in milliseconds: a PING every ``ivl_ms`` (0: this end
    sends none); the connection is cut when nothing arrives within ``timeout_ms`` of a PING;
    ``ttl_ms`` is what the other end waits for our traffic, after our PING, before cutting it."""

    ivl_ms: int
    timeout_ms: int
    ttl_ms: int


class ZmtpBeats(NamedTuple):
    """Both ends of a mesh connection: the connecting side (DEALER, SUB) pings, the bound side
    (ROUTER, XPUB) only answers, and cuts the connection when the TTL of the last PING passes
    without traffic."""

    connecting: ZmtpHeartbeat
    bound: ZmtpHeartbeat


def zmtp_heartbeat_for(heartbeat_interval: float, stale_after: float,
                       offline_after: float | None = None) -> ZmtpBeats:
    """ZMTP heartbeats that follow the liveness settings and cost almost nothing at idle.

    The mesh heartbeat decides when a peer is stale or offline (every ``heartbeat_interval``, on
    the DEALER connections). The ZMTP heartbeats only clear a connection that died without a FIN
    (a host that lost power, a cut cable), which TCP alone notices after minutes (RELIABILITY.md),
    so that the DEALER reconnects and the ROUTER forgets it: one PING per ``offline_after``, sent
    by the connecting side only, is enough for that, where a PING per second from both ends of
    all four connections of a pair was ~16 of the ~32 packets a peer cost per second at idle. No
    connection is cut before ``offline_after`` of silence, so a stall shorter than ``stale_after``
    (a GC pause, a busy CPU, a VM steal) costs no connection."""
    offline = offline_after if offline_after is not None else max(stale_after * 10 / 3, stale_after)
    ivl = max(int(offline * 1000), int(heartbeat_interval * 1000), 250)
    timeout = max(int(offline * 1000), int(stale_after * 1000), ivl)
    ttl = min(2 * ivl + timeout, 6_553_500)  # the PING's TTL field counts tenths of a second
    ttl -= ttl % 100
    return ZmtpBeats(connecting=ZmtpHeartbeat(ivl_ms=ivl, timeout_ms=timeout, ttl_ms=ttl),
                     bound=ZmtpHeartbeat(ivl_ms=0, timeout_ms=timeout, ttl_ms=0))


DEFAULT_ZMTP_HEARTBEAT = zmtp_heartbeat_for(1.0, 3.0, 10.0)
"""What the default settings give (heartbeat_interval 1 s, stale_after 3 s, offline_after 10 s)."""


def _zmtp_heartbeats(sock: zmq.Socket[Any], beats: ZmtpHeartbeat) -> None:
    sock.setsockopt(zmq.HEARTBEAT_IVL, beats.ivl_ms)
    if beats.ivl_ms:
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, beats.timeout_ms)
        sock.setsockopt(zmq.HEARTBEAT_TTL, beats.ttl_ms)


def mesh_router(ctx: zmq.Context[Any], max_frame_bytes: int, curve: Curve | None = None,
                beats: ZmtpBeats = DEFAULT_ZMTP_HEARTBEAT) -> zmq.Socket[Any]:
    """The mesh inbound ROUTER: peers' DEALERs connect here."""
    sock: zmq.Socket[Any] = ctx.socket(zmq.ROUTER)
    _common(sock)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # Handover on: a DEALER that reconnects (zmq does that by itself, with the same routing id)
    # takes its own stale connection over; with handover off that reconnect was refused and the
    # link stayed one-way until a redial (RELIABILITY.md). Impostors (another trusted node
    # connecting with a peer's id knocked the real connection off) are stopped by the routing id's
    # random part per DEALER (peer_routing_id): only this ROUTER ever sees it, so nobody else can
    # present it, and a routing id maps to a peer only through its authenticated HELLO.
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.RCVHWM, MESH_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    _zmtp_heartbeats(sock, beats.bound)
    curve_server(sock, curve)
    return sock


def mesh_xpub(ctx: zmq.Context[Any], max_frame_bytes: int, curve: Curve | None = None,
              beats: ZmtpBeats = DEFAULT_ZMTP_HEARTBEAT) -> zmq.Socket[Any]:
    """The topic publisher; XPUB so subscriptions arrive as messages the node can read."""
    sock: zmq.Socket[Any] = ctx.socket(zmq.XPUB)
    _common(sock)
    sock.setsockopt(zmq.SNDHWM, MESH_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    _zmtp_heartbeats(sock, beats.bound)
    curve_server(sock, curve)
    return sock


def peer_routing_id(own_node_id: str) -> bytes:
    """``<node id>.<16 random hex digits>``: new for every DEALER, so it cannot be guessed from
    what other peers see, and a restart or redial never reuses a routing id still in use."""
    return f"{own_node_id}.{os.urandom(8).hex()}".encode()


def peer_dealer(ctx: zmq.Context[Any], own_node_id: str, curve: Curve | None = None,
                server_key: str | None = None,
                beats: ZmtpBeats = DEFAULT_ZMTP_HEARTBEAT) -> zmq.Socket[Any]:
    """One DEALER per peer; its routing id is ``peer_routing_id`` (our node id and a random part);
    the peer maps it to us from our HELLO."""
    sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
    _common(sock)
    sock.setsockopt(zmq.ROUTING_ID, peer_routing_id(own_node_id))
    sock.setsockopt(zmq.SNDHWM, MESH_HWM)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    _zmtp_heartbeats(sock, beats.connecting)
    curve_client(sock, curve, server_key)
    return sock


def peer_sub(ctx: zmq.Context[Any], max_frame_bytes: int, curve: Curve | None = None,
             server_key: str | None = None,
             beats: ZmtpBeats = DEFAULT_ZMTP_HEARTBEAT) -> zmq.Socket[Any]:
    """One SUB per peer, connected to the peer's XPUB."""
    sock: zmq.Socket[Any] = ctx.socket(zmq.SUB)
    _common(sock)
    sock.setsockopt(zmq.RCVHWM, MESH_HWM)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    _zmtp_heartbeats(sock, beats.connecting)
    curve_client(sock, curve, server_key)
    return sock


def agent_router(ctx: zmq.Context[Any], inbox_hwm: int, max_frame_bytes: int = -1) -> zmq.Socket[Any]:
    """The local agent socket (ipc://). MANDATORY: a vanished agent is an error, not a drop.

    ``max_frame_bytes``: a larger frame disconnects that agent's connection before the daemon
    holds it (a 256 MiB frame once pushed the daemon to 557 MB before TOO_LARGE); frames
    up to it that exceed ``max_payload_bytes`` still get TOO_LARGE at the edge.
    """
    sock: zmq.Socket[Any] = ctx.socket(zmq.ROUTER)
    _common(sock)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    sock.setsockopt(zmq.SNDHWM, inbox_hwm)
    sock.setsockopt(zmq.RCVHWM, MESH_HWM)
    return sock


def bind_tcp(sock: zmq.Socket[Any], addresses: list[str], port: int) -> int:
    """Bind ``sock`` on every address with one port (0 = pick a free one); return the port."""
    chosen = port
    for addr in addresses:
        if chosen == 0:
            endpoint = sock.bind_to_random_port(f"tcp://{addr}", min_port=1024, max_port=65535)
            chosen = int(endpoint)
        else:
            sock.bind(f"tcp://{addr}:{chosen}")
    return chosen


class Reactor:
    """Drives zmq sockets from an asyncio loop without a future per message."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handlers: dict[zmq.Socket[Any], Handler] = {}
        self._copy: dict[zmq.Socket[Any], bool] = {}
        self._fds: dict[zmq.Socket[Any], int] = {}
        self._kicked: set[zmq.Socket[Any]] = set()
        self._paused: dict[zmq.Socket[Any], tuple[Handler, bool]] = {}
        self._kick_scheduled = False
        self._draining: zmq.Socket[Any] | None = None
        self._rechecking = False
        self._at_drain_end: list[Callable[[], None]] = []
        self.handler_errors = 0

    def add(self, sock: zmq.Socket[Any], handler: Handler, copy: bool = True) -> None:
        """Call ``handler(frames)`` for every multipart message that arrives on ``sock``.

        With ``copy=False`` the handler gets ``zmq.Frame`` objects, whose metadata (the ZAP
        ``User-Id``) it can read.
        """
        fd = int(sock.getsockopt(zmq.FD))
        self._handlers[sock] = handler
        self._copy[sock] = copy
        self._fds[sock] = fd
        self._loop.add_reader(fd, self._drain, sock)
        self.kick(sock)  # messages may already be waiting: the edge may have passed

    def remove(self, sock: zmq.Socket[Any]) -> None:
        fd = self._fds.pop(sock, None)
        self._handlers.pop(sock, None)
        self._copy.pop(sock, None)
        self._kicked.discard(sock)
        if fd is not None:
            self._loop.remove_reader(fd)

    def pause(self, sock: zmq.Socket[Any]) -> None:
        """Stop reading ``sock`` (a drain under way stops after the message it is at); what
        arrives waits in the socket's pipe, and past its high-water mark in the sender's."""
        handler = self._handlers.get(sock)
        if handler is not None:
            self._paused[sock] = (handler, self._copy.get(sock, True))
            self.remove(sock)

    def resume(self, sock: zmq.Socket[Any]) -> None:
        """Read ``sock`` again, starting with what waited while it was paused."""
        entry = self._paused.pop(sock, None)
        if entry is None or sock.closed:
            return
        self.add(sock, *entry)
        self._kicked.add(sock)  # even inside a drain of it: look again once that drain ends
        if self._draining is None and not self._kick_scheduled:
            self._kick_scheduled = True
            self._loop.call_soon(self._recheck)

    def soon(self, fn: Callable[[], None]) -> None:
        """``fn()`` once the work of this loop turn is done: at the end of the drain under way (the
        callbacks it drove are done; no extra loop turn), else on the next turn (``call_soon``).
        The client's batch flush and ack flush use it: a reply made by a handler inside the drain
        leaves when the drain ends, instead of after one more pass of the loop."""
        if self._draining is not None:
            self._at_drain_end.append(fn)
        else:
            self._loop.call_soon(fn)

    def kick(self, sock: zmq.Socket[Any]) -> None:
        """Note that ``sock`` was sent on; its read edge is re-checked before the loop sleeps.

        Inside a drain the re-check happens when the drain ends (no extra loop turn); from a
        timer or another callback it is scheduled with ``call_soon``.
        """
        if sock in self._handlers and sock is not self._draining:
            self._kicked.add(sock)
            if self._draining is None and not self._kick_scheduled:
                self._kick_scheduled = True
                self._loop.call_soon(self._recheck)

    def _recheck(self) -> None:
        self._kick_scheduled = False
        if self._rechecking:
            return  # the running recheck loop below picks up what was kicked
        self._rechecking = True
        try:
            for _ in range(4):  # bounded: under sustained load, give the loop a turn
                if not self._kicked:
                    return
                kicked, self._kicked = self._kicked, set()
                for sock in kicked:
                    if self._readable(sock):
                        self._drain(sock)
        finally:
            self._rechecking = False
        if self._kicked and not self._kick_scheduled:
            self._kick_scheduled = True
            self._loop.call_soon(self._recheck)

    def _readable(self, sock: zmq.Socket[Any]) -> bool:
        if sock not in self._handlers or sock.closed:
            return False
        return bool(int(sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)

    def _drain(self, sock: zmq.Socket[Any]) -> None:
        if self._draining is not None:  # re-entered from a recheck: finish the outer drain first
            self._kicked.add(sock)
            return
        handler = self._handlers.get(sock)
        if handler is None or sock.closed:
            return
        getsockopt = sock.getsockopt
        handlers = self._handlers
        copy = self._copy.get(sock, True)
        recv: Callable[[], list[Any]] = (partial(recv_frames, sock) if copy else
                                         partial(sock.recv_multipart, zmq.NOBLOCK, copy=False))
        deadline = time.perf_counter() + DRAIN_SECONDS
        self._draining = sock
        try:
            for n in range(DRAIN_BUDGET):
                if n & 15 == 15 and time.perf_counter() > deadline:
                    self._loop.call_soon(self._drain, sock)
                    break
                try:
                    frames = recv()
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    log.warning("recv failed on %s: %s", sock, exc)
                    break
                try:
                    handler(frames)
                except Exception as exc:
                    self.handler_errors += 1
                    tb = exc.__traceback__
                    while tb is not None and tb.tb_next is not None:
                        tb = tb.tb_next
                    where = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb else "?"
                    key = f"raised:{type(exc).__name__}:{where}"
                    if key not in _quiet:
                        log.exception("message handler raised; message dropped (%d so far; logged "
                                      "once per cause)", self.handler_errors)
                    _quiet.log(key, "handler failure %s", key, level=logging.DEBUG)
                if sock not in handlers:
                    break  # the handler paused (or removed) the socket
                # Nothing more to read: stop here rather than pay a zmq.Again exception (~4 us, a
                # third of a relay hop). Reading EVENTS re-arms the edge-triggered FD like EAGAIN.
                try:
                    more = int(getsockopt(_EVENTS)) & _POLLIN
                except zmq.ZMQError:  # the handler closed the socket
                    break
                if not more:
                    break
            else:
                # Budget used up: more may be waiting; come back after timers and other sockets ran.
                self._loop.call_soon(self._drain, sock)
        finally:
            self._run_at_drain_end()  # still draining: what they send is kicked, re-checked below
            self._draining = None
        if self._kicked:
            # Sockets we sent on while draining may have lost their read edge: look now.
            self._recheck()

    def _run_at_drain_end(self) -> None:
        pending = self._at_drain_end
        while pending:
            fn = pending.pop(0)
            try:
                fn()
            except Exception:
                self.handler_errors += 1
                log.exception("a callback at the end of a drain raised")

    def close(self) -> None:
        self._paused.clear()
        for sock in list(self._handlers):
            self.remove(sock)


class SendQueue:
    """Sends on one socket without ever blocking the loop; what the high-water mark refuses waits here.

    Shared by everything that sends on a reactor-driven socket from asyncio (the agent client's
    DEALER): ``push`` sends with NOBLOCK, keeps order (once something waits, everything after it
    waits too), retries once per loop turn until the socket takes it, and ``kick``s the reactor
    after every send (a send can swallow the read edge). ``writable`` is clear while something waits,
    so a producer can await it for backpressure. The queue is bounded by the caller's backpressure
    (``limit`` is what the caller compares ``len()`` with), not here: a control message must never
    be refused.
    """

    def __init__(self, sock: zmq.Socket[Any], reactor: Reactor, loop: asyncio.AbstractEventLoop,
                 limit: int) -> None:
        self._sock = sock
        self._send = frame_sender(sock)
        self._reactor = reactor
        self._loop = loop
        self._queue: deque[list[bytes]] = deque()
        self._retry_scheduled = False
        self.limit = limit
        self.writable = asyncio.Event()
        self.writable.set()

    def __len__(self) -> int:
        return len(self._queue)

    def push(self, frames: list[bytes]) -> None:
        if self._queue:
            self._queue.append(frames)
            return
        try:
            self._send(frames)
        except zmq.Again:
            self._queue.append(frames)
            self.writable.clear()
            self._schedule_retry()
        self._reactor.kick(self._sock)

    def _schedule_retry(self) -> None:
        if not self._retry_scheduled:
            self._retry_scheduled = True
            self._loop.call_soon(self._retry)

    def _retry(self) -> None:
        self._retry_scheduled = False
        if self._sock.closed:
            return
        send = self._send
        while self._queue:
            try:
                send(self._queue[0])
            except zmq.Again:
                self._schedule_retry()
                break
            self._queue.popleft()
        else:
            self.writable.set()
        self._reactor.kick(self._sock)

    def clear(self) -> None:
        """Forget what waits (the socket is being closed)."""
        self._queue.clear()
        self.writable.set()


AGENT_HWM = 10_000
"""Send high-water mark of an agent's DEALER (the client's side of the ipc socket)."""
AGENT_RCVHWM = 1000
"""Receive high-water mark of an agent's DEALER (ZeroMQ messages; a batch is one). What an agent
does not read (all its handler slots taken, meshd/client/handler_slots.py) fills this pipe, then the
daemon's inbox (``inbox_cap``), and then senders hear INBOX_FULL: bounded, not 10,000 deep as
before. Not smaller: at 100 (and 16) a fast receiver's bursts were refused and a plain send
loop, which reads nothing while it sends, lost error notices past the daemon's answer lane
(bench/bench.py --quick, rows (b) and (h))."""


def agent_dealer(ctx: zmq.Context[Any]) -> zmq.Socket[Any]:
    """An agent's DEALER to its local daemon (the client library's one socket)."""
    sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
    _common(sock)
    sock.setsockopt(zmq.SNDHWM, AGENT_HWM)
    sock.setsockopt(zmq.RCVHWM, AGENT_RCVHWM)
    return sock
