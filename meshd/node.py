"""The daemon: peers, the agent directory, and routing.

One ``Node`` per host. It owns every zmq socket (see meshd.transport) and runs in one asyncio
loop: the reactor drives the routing path, timers drive heartbeats and liveness, zeroconf runs
in the same loop (meshd.discovery).

Start-up order (``Node.start``):
  1. load or create the node id in the state dir (a restarted daemon is the same peer again);
  2. security: CURVE keys and the trust store, and the ZAP handler before any server socket;
  3. open the delivery store (qos-1 outbox and seen-set) and resume what it holds;
  4. bind the mesh ROUTER, the XPUB and the local agent socket (mode 0660); start the reactor;
  5. advertise and browse with zeroconf; dial static peers (HELLO);
  6. start the timers (heartbeats, liveness, qos-1 retries, trust reload);
  7. plugins: worker thread, then ``meshd_startup``; the node is ready (sd_notify READY=1).
Shutdown (``Node.stop``), the reverse:
  1. STOPPING=1; ``meshd_shutdown``; stop the timers; from here on nobody is greeted;
  2. send BYE to every peer (they drop us at once); unregister from mDNS (goodbye packets);
  3. stop the reactor; commit and close the delivery store; close sockets with a bounded
     linger; terminate the context; remove the agent socket file (only if we bound it);
  4. stop the plugin worker (bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq

from . import protocol as P
from . import transport
from .builtin_plugins import JsonlDeadLetterSink
from .config import Settings
from .delivery import DeadLetters, DeliveryStore, OutboxEntry, Qos1
from .directory import Directory, LocalAgent
from .discovery import Discovery, default_interfaces
from .liveness import PeerState, next_state
from .logonce import LogOnce
from .outcomes import Outcomes
from .peers import Peer, PeerEvents, PeerTable
from .plugins import PluginHost
from .protocol import FrameError, Kind
from .sdnotify import Notifier
from .security import Security

log = logging.getLogger("meshd.node")


_AGENT_DATA_KINDS = P.ROUTED_KINDS | {Kind.PUBLISH, Kind.BATCH}
_REPLAYABLE = frozenset({Kind.SEND, Kind.REQUEST, Kind.BATCH})


def _letter_summary(letter: dict[str, Any]) -> dict[str, Any]:
    header = letter.get("header") or {}
    return {
        "seq": letter["seq"], "at": letter["at"], "reason": letter["reason"], "detail": letter["detail"],
        "attempts": letter.get("attempts", 0), "header": header,
        "kind": header.get(P.KIND), "from": header.get(P.FROM), "to": header.get(P.TO),
        "topic": header.get(P.TOPIC), "bytes": sum(len(f) for f in letter["frames"]),
    }


def load_node_id(state_dir: Path) -> str:
    """The node id, created once and kept, so a restarted daemon is the same peer again."""
    path = state_dir / "node_id"
    try:
        node_id = path.read_text().strip()
        if len(node_id) == 16 and all(c in "0123456789abcdef" for c in node_id):
            return node_id
        log.warning("ignoring malformed node id in %s", path)
    except FileNotFoundError:
        pass
    node_id = os.urandom(8).hex()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(node_id + "\n")
    os.replace(tmp, path)
    return node_id


class Node:
    """A meshd daemon. ``await start()``, then ``await stop()``; or ``await serve(trigger)``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.node_id = ""
        self.incarnation = os.urandom(4).hex()
        self.name = settings.name
        self.stats: Counter[str] = Counter()
        self.dead_letters = DeadLetters(settings.dead_letter_capacity)
        self.store: DeliveryStore | None = None
        self._flush_scheduled = False
        self._socket_bound = False
        self._after_flush: list[Callable[[], Any]] = []
        self.directory = Directory()
        self.local = self.directory.local  # name -> LocalAgent (the directory owns it)
        self.local_by_rid = self.directory.local_by_rid
        self.interfaces: list[str] = []
        self.router_port = 0
        self.pub_port = 0
        self.socket_path = settings.resolved_socket()
        self.started_at = 0.0
        self.ready = asyncio.Event()
        self._ctx: zmq.Context[Any] | None = None
        self._reactor: transport.Reactor | None = None
        self._discovery: Discovery | None = None
        self._timers: list[asyncio.Task[None]] = []
        self._stopping = False
        self._quiet = LogOnce(log)  # bounded: many keys come from peers
        self._max_frame = settings.max_payload_bytes + P.BATCH_OVERHEAD + 4096
        self.security = Security(settings)
        self.peer_table = PeerTable(
            settings, node_id="", name=self.name, incarnation=self.incarnation, security=self.security,
            stats=self.stats, quiet=self._quiet, interfaces=self.interfaces, max_frame=self._max_frame,
            events=PeerEvents(
                state_changed=self._peer_state_changed, directory=self._apply_directory,
                restarted=self._peer_restarted, acks=self._acks_arrived, reject=self._reject_control,
                topic_message=self._on_topic, topic_keys=lambda: self.directory.local_topic_keys.keys(),
                directory_body=self.directory.body, directory_version=lambda: self.directory.version,
                telemetry=self._telemetry_body,
            ),
        )
        self.peers = self.peer_table.peers  # node id -> Peer (the peer table owns it)
        self.notifier = Notifier()
        self.plugins = PluginHost(settings.plugins)
        self.plugins.load()
        if settings.dead_letter_jsonl:
            self.plugins.register(JsonlDeadLetterSink(settings.state_dir / "deadletters.jsonl"),
                                  name="meshd.jsonl_dead_letters")
        self.outcomes = Outcomes(self.plugins)

    # ----------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        s = self.settings
        s.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.node_id = load_node_id(s.state_dir)
        self.directory.node_id = self.peer_table.node_id = self.node_id
        self.interfaces[:] = list(s.interfaces) or default_interfaces()
        if not self.interfaces:
            raise RuntimeError("no usable network interface: pass --interface IP")
        loop = asyncio.get_running_loop()
        self._ctx = zmq.Context()
        self._reactor = transport.Reactor(loop)
        self.security.start(self._ctx, self._reactor, self.interfaces)
        self.store = DeliveryStore(s.state_dir / "delivery.db", seen_ttl=2 * s.qos1_ttl + 60.0)
        self.qos = Qos1(
            self.store, attempts=s.qos1_attempts, ack_timeout=s.qos1_ack_timeout, ttl=s.qos1_ttl,
            attempt=self._qos_attempt, confirm=self._qos_confirm, send_acks=self._qos_send_acks,
            acked=self._qos_acked, give_up=self._qos_give_up, schedule_flush=self._schedule_flush,
        )

        self.router = transport.mesh_router(self._ctx, self._max_frame, self.security.curve)
        self.router_port = transport.bind_tcp(self.router, self.interfaces, s.port)
        self.xpub = transport.mesh_xpub(self._ctx, self._max_frame, self.security.curve)
        self.pub_port = transport.bind_tcp(self.xpub, self.interfaces, s.pub_port)
        self.agents_sock = transport.agent_router(self._ctx, max(s.inbox_cap, 1))
        self._bind_agent_socket()
        self.agents_monitor = self.agents_sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

        check_uid = self.security.check_uid
        self._reactor.add(self.router, self._on_mesh_checked if check_uid else self._on_mesh,
                          copy=not check_uid)
        self._reactor.add(self.xpub, self._on_xpub)
        self._reactor.add(self.agents_sock, self._on_agent)
        self._reactor.add(self.agents_monitor, self._on_agent_monitor)

        self.started_at = time.monotonic()
        self.peer_table.start(self._ctx, self._reactor, self.router_endpoints(), self.pub_endpoints())
        if s.discovery:
            self._discovery = Discovery(
                node_id=self.node_id, mesh=s.mesh, name=self.name, interfaces=self.interfaces,
                router_port=self.router_port, pub_port=self.pub_port, proto=P.PROTOCOL_VERSION,
                on_found=self.peer_table.on_discovered, on_lost=self.peer_table.on_discovery_lost,
                pubkey=self.security.public_key,
            )
            await self._discovery.start()
        for endpoint in s.peers:
            self.peer_table.dial_static(endpoint)
        self._timers.append(asyncio.create_task(self._heartbeat_loop(), name="meshd-heartbeat"))
        self._timers.append(asyncio.create_task(self._liveness_loop(), name="meshd-liveness"))
        self._timers.append(asyncio.create_task(self._qos_loop(), name="meshd-qos1"))
        if self.security.trust is not None and self.security.trust.mode == "keys":
            self._timers.append(asyncio.create_task(self._trust_loop(), name="meshd-trust"))
        log.info(
            "node %s (%s) mesh=%r router=%s pub=%s agents=%s%s", self.node_id, self.name, s.mesh,
            self.router_endpoints(), self.pub_endpoints(), self.socket_path,
            " INSECURE (plaintext mesh)" if s.insecure else "",
        )
        self.outcomes.enabled = self.plugins.wants("meshd_collaboration")
        self.plugins.start()
        await self.plugins.startup(self)
        self.ready.set()
        self.notifier.ready(self.status_line())
        self._timers.append(asyncio.create_task(self._status_loop(), name="meshd-status"))

    def _bind_agent_socket(self) -> None:
        path = self.socket_path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        if path.exists():
            if not stat.S_ISSOCK(path.stat().st_mode):
                raise RuntimeError(f"{path} exists and is not a socket")
            if self._socket_in_use(path):
                raise RuntimeError(f"another meshd is serving {path}")
            path.unlink()
        old_umask = os.umask(0o117)  # the socket file is created 0660, never world-accessible
        try:
            self.agents_sock.bind(f"ipc://{path}")
            self._socket_bound = True
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o660)

    def _socket_in_use(self, path: Path) -> bool:
        import socket as pysocket

        probe = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
        try:
            probe.connect(str(path))
            return True
        except OSError:
            return False
        finally:
            probe.close()

    async def stop(self) -> None:
        """Drain and leave: BYE to peers, mDNS goodbye, close sockets (bounded linger)."""
        if self._stopping:
            return
        self._stopping = self.peer_table.stopping = True
        self.notifier.stopping(f"stopping: {self.status_line()}")
        if self.ready.is_set():
            await self.plugins.shutdown(self)
        for task in self._timers:
            task.cancel()
        for task in self._timers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.peer_table.say_bye()
        if self._discovery is not None:
            try:
                await self._discovery.stop()
            except Exception:
                log.exception("discovery stop failed")
        if self._reactor is not None:
            self._reactor.close()
        if self.store is not None:
            try:
                self.store.close()
            except Exception:
                log.exception("closing the delivery store failed")
        self.security.close()
        if self._ctx is not None:
            self.peer_table.close()
            # A start that failed half-way may not have made every socket: close what exists.
            agents_sock = getattr(self, "agents_sock", None)
            if agents_sock is not None:
                with contextlib.suppress(zmq.ZMQError):
                    agents_sock.disable_monitor()
            monitor = getattr(self, "agents_monitor", None)
            if monitor is not None:
                monitor.close(0)
            for sock in (getattr(self, "router", None), getattr(self, "xpub", None), agents_sock):
                if sock is not None:
                    sock.close(transport.LINGER_MS)
            self._ctx.term()
        if self._socket_bound:  # never remove another daemon's socket after a failed start
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self.notifier.close()
        self.plugins.stop()
        log.info("node %s stopped", self.node_id)

    async def serve(self, shutdown_trigger: asyncio.Future[Any] | asyncio.Event) -> None:
        """Start, run until the trigger fires, stop. Tests stop a node without signals."""
        try:
            await self.start()
        except BaseException:
            await self.stop()  # release what a half-finished start bound (socket file, context)
            raise
        try:
            if isinstance(shutdown_trigger, asyncio.Event):
                await shutdown_trigger.wait()
            else:
                await shutdown_trigger
        finally:
            await self.stop()

    # ----------------------------------------------------------------------------- endpoints

    def router_endpoints(self) -> list[str]:
        return [f"tcp://{a}:{self.router_port}" for a in self.interfaces]

    def pub_endpoints(self) -> list[str]:
        return [f"tcp://{a}:{self.pub_port}" for a in self.interfaces]

    # ----------------------------------------------------------------------------- peers

    def _log_once(self, key: str, msg: str, *args: Any) -> None:
        self._quiet.log(key, msg, *args)

    def _peer_state_changed(self, peer: Peer, old: PeerState, new: PeerState) -> None:
        self.plugins.peer_state({"node": peer.node_id, "name": peer.name, "state": str(new),
                                 "router": peer.connected_router}, str(old), str(new))
        if new is PeerState.OFFLINE:
            self.directory.drop_node(peer.node_id)

    def _peer_restarted(self, peer: Peer) -> None:
        self.directory.drop_node(peer.node_id)
        n = self.qos.reack_origin(peer.node_id, time.time() - self.settings.qos1_ttl)
        if n:
            log.info("re-acked %d qos-1 unit(s) handled for restarted peer %s", n, peer.node_id)

    def _acks_arrived(self, ids: list[str]) -> None:
        self.qos.acks_arrived(ids)

    def _reject_control(self, exc: FrameError, frames: list[bytes], origin: str) -> None:
        self._reject(exc, frames, origin=origin)

    def _apply_directory(self, peer: Peer, body: Any) -> None:
        applied = self.directory.apply_node(peer.node_id, body)
        if applied is None:
            self.stats["bad_directory"] += 1
            return
        peer.dir_version, losers = applied
        for mine in losers:
            self._evict_local(mine, f"name {mine.name!r} is registered on node {peer.node_id} too")

    # ----------------------------------------------------------------------------- mesh ingress

    def _on_mesh_checked(self, frames: list[Any]) -> None:
        """Keys mode: the ZAP User-Id (the authenticated key) must be the key the sender claims."""
        try:
            uid = frames[1].get("User-Id")
        except zmq.ZMQError:
            uid = ""
        raw = [f.bytes for f in frames]
        peer = self.peers.get(raw[0].decode("ascii", "replace"))
        verdict = self.security.admit(uid, peer.pubkey if peer is not None and peer.greeted else None)
        if verdict is not None:
            self.stats[verdict] += 1
            if peer is not None and verdict == "dropped_spoofed":
                self._log_once(f"spoof:{peer.node_id}:{uid}", "dropped traffic claiming to be node %s "
                               "from key %s (its key is %s)", peer.node_id, uid, peer.pubkey)
            return
        self.peer_table.authenticated_key = uid
        self._on_mesh(raw)

    def _on_mesh(self, frames: list[bytes]) -> None:
        """Everything peers send us: control, routed messages and batches."""
        rid = frames[0]
        try:
            header = P.decode_routed_header(frames)
        except FrameError as exc:
            self._reject(exc, frames, origin=f"peer {rid[:32]!r}", header=exc.fields)
            return
        kind = header.kind
        peer = self.peers.get(rid.decode("ascii", "replace"))
        if kind in P.PEER_CONTROL_KINDS:
            self.peer_table.on_control(rid, peer, header, frames)
            return
        if peer is None or not peer.greeted:
            self.peer_table.unknown_sender(peer)
            return
        self.peer_table.heard_from(peer)
        to = header.to
        if not isinstance(to, str) or kind not in _AGENT_DATA_KINDS:
            self._reject(FrameError("not_deliverable", f"{kind} without a destination"), frames,
                         origin=f"peer {peer.node_id}", header=header)
            return
        if kind == Kind.ERROR and header.corr in self.qos.store.outbox:
            err = header.get(P.ERROR)
            self.qos.bounced(str(header.corr), str(err.get("code")) if isinstance(err, dict) else "ERROR")
            return
        if header.qos == 1 and self.qos.reack_if_done(str(header.id), peer.node_id):
            return  # handled already (maybe by an agent that has left since): ack, never bounce
        name, _, node = to.partition("@")
        agent = self.local.get(name)
        if agent is None or (node and node not in (self.node_id, self.name)):
            self._bounce(header, frames[1:], P.ErrorCode.NO_SUCH_AGENT,
                         f"no agent named {to!r} on node {self.node_id}", origin=peer.node_id)
            return
        if kind == Kind.BATCH and len(frames) != 4:
            self._reject(FrameError("batch_odd_frames", str(len(frames))), frames,
                         origin=f"peer {peer.node_id}", header=header)
            return
        self._deliver_local(agent, header, frames[1:], peer.node_id)

    # ----------------------------------------------------------------------------- agents

    def _on_agent(self, frames: list[bytes]) -> None:
        """Everything local agents send us."""
        rid = frames[0]
        try:
            header = P.decode_routed_header(frames)
        except FrameError as exc:
            # A header that decoded but has a field out of range names its id, so the sender's
            # request fails at once instead of timing out.
            self._reject(exc, frames, origin="local agent", header=exc.fields)
            corr = exc.fields.get(P.ID) if exc.fields else None
            self._send_agent_error(rid, corr, P.ErrorCode.VALIDATION_FAILED, f"malformed message: {exc}")
            return
        kind = header.kind
        agent = self.local_by_rid.get(rid)
        if agent is not None:
            agent.last_seen = time.monotonic()
        if kind in P.AGENT_CONTROL_KINDS:
            self._on_agent_control(rid, agent, kind, header, frames)
            return
        if kind not in _AGENT_DATA_KINDS:
            # hello, hb, dir, ok, ... are daemon business: an agent must not forge them.
            self._refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                         f"agents may not send {kind!r} messages")
            return
        if agent is None:
            self._refuse(rid, header, frames, P.ErrorCode.NOT_REGISTERED, "register a name before sending")
            return
        if header.sender != agent.name:
            self._refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                         f"'from' must be your registered name {agent.name!r}")
            return
        if len(frames) != 4:
            self._send_agent_error(rid, header.id, P.ErrorCode.VALIDATION_FAILED,
                                   f"a {kind} message has exactly 3 frames")
            return
        limit = self.settings.max_payload_bytes + (P.BATCH_OVERHEAD if kind == Kind.BATCH else 0)
        if len(frames[3]) > limit:
            self._refuse(rid, header, frames, P.ErrorCode.TOO_LARGE,
                         f"{kind} of {len(frames[3])} bytes exceeds max_payload_bytes="
                         f"{self.settings.max_payload_bytes}")
            return
        topic = header.topic
        if kind == Kind.PUBLISH or (kind == Kind.BATCH and header.to is None):
            if not P.valid_topic(topic):
                self._refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                             "publish needs a valid topic")
                return
            self._publish(agent, str(topic), header, frames[1:])
            return
        to = header.to
        if not isinstance(to, str):
            self._refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED, f"{kind} needs a 'to'")
            return
        if header.qos == 1:
            unit_id = header.id
            if kind not in (Kind.SEND, Kind.BATCH) or not isinstance(unit_id, str):
                self._refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                             "qos 1 applies to send (single or batched) with a string id")
                return
            self.qos.accept(rid, agent.name, unit_id, to, frames[1:])
            return
        if kind == Kind.REQUEST:
            hops = header.hops
            if hops > self.settings.hop_limit:
                self._bounce(header, frames[1:], P.ErrorCode.HOP_LIMIT,
                             f"forwarded {hops} times; the hop limit is {self.settings.hop_limit}")
                return
            deadline = header.deadline
            if deadline is not None and deadline < time.time():
                self._bounce(header, frames[1:], P.ErrorCode.TIMEOUT,
                             "the request's deadline passed before it was delivered")
                return
        if not self.outcomes.enabled:
            self._route(to, header, frames[1:])
            return
        sends = self.outcomes.outgoing(header, frames[1:])
        self.outcomes.sends_routed(sends, self._route(to, header, frames[1:]))

    def _refuse(self, rid: bytes, header: P.Header, frames: list[bytes], code: str,
                message: str) -> None:
        """Refuse an agent's message at the edge: one error per message, batches included."""
        self.stats[f"refused_{code.lower()}"] += 1
        ids: list[Any] = [header.id]
        if header.kind == Kind.BATCH:
            with contextlib.suppress(FrameError):
                ids = [h.get(P.ID) for h, _ in P.split_batch(frames[1:])]
        for msg_id in ids:
            self._send_agent_error(rid, msg_id, code, message)

    def _route(self, to: str, header: P.Header, msg: list[bytes]) -> str | None:
        """Deliver ``msg`` (signature, header, payload frames) to agent ``to`` wherever it is.

        Returns None when it went on its way, else the error code it bounced with.
        """
        name, _, node = to.partition("@")
        agent = self.local.get(name)
        if agent is not None and (not node or node in (self.node_id, self.name)):
            return self._deliver_local(agent, header, msg, self.node_id)
        host = self.directory.host_of(name)
        peer = self.peers.get(host) if host is not None else None
        if peer is None or (node and node not in (peer.node_id, peer.name)):
            return self._bounce(header, msg, P.ErrorCode.NO_SUCH_AGENT, f"no agent named {to!r} in the mesh")
        if peer.state is PeerState.OFFLINE or peer.dealer is None:
            return self._bounce(header, msg, P.ErrorCode.PEER_UNREACHABLE,
                                f"node {peer.node_id} hosting {name!r} is offline", retry=True)
        try:
            peer.dealer.send_multipart(msg, zmq.NOBLOCK)
        except zmq.ZMQError:
            return self._bounce(header, msg, P.ErrorCode.PEER_UNREACHABLE,
                                f"node {peer.node_id} is not accepting messages", retry=True)
        self.stats["forwarded"] += 1
        return None

    def _deliver_local(self, agent: LocalAgent, header: P.Header, msg: list[bytes],
                       origin: str) -> str | None:
        unit_id = header.id if header.qos == 1 else None
        if unit_id is not None and not self.qos.admit(str(unit_id), origin, agent.rid, self._rid_alive):
            return None  # a duplicate: already handled or in the agent's hands
        if self.outcomes.inflight:
            self.outcomes.answer(agent.name, header, msg)
        code: str | None = None
        try:
            self.agents_sock.send_multipart([agent.rid, *msg], zmq.NOBLOCK)
            self.stats["delivered"] += 1
        except zmq.Again:
            if unit_id is not None:
                self.qos.not_delivered(str(unit_id))
            code = self._bounce(header, msg, P.ErrorCode.INBOX_FULL, f"inbox of {agent.name!r} is full",
                                retry=True, retry_after=0.1, origin=origin)
        except zmq.ZMQError:
            if unit_id is not None:
                self.qos.not_delivered(str(unit_id))
            self._remove_local(agent, "connection gone")
            code = self._bounce(header, msg, P.ErrorCode.NO_SUCH_AGENT, f"agent {agent.name!r} disconnected",
                                origin=origin)
        assert self._reactor is not None
        self._reactor.kick(self.agents_sock)
        return code

    def _bounce(self, header: P.Header, msg: list[bytes], code: str, message: str, *,
                retry: bool = False, retry_after: float | None = None, origin: str | None = None) -> str:
        """Tell the sender of an undeliverable message why, as an error envelope per message.

        A qos-1 unit of ours does not bounce: it waits in the outbox for another try. A delegated
        request's error goes to its origin (the original requester), with its correlation id.
        Returns ``code``, so routing can report why a message did not go through.
        """
        self.stats[f"undeliverable_{code.lower()}"] += 1
        if header.qos == 1:
            unit_id = str(header.id)
            if self.qos.bounced(unit_id, code):
                return code  # ours: it waits in our outbox
            # Another daemon's unit: it still holds it. Tell that daemon (not the agent, which
            # may be gone), so the unit waits there instead of using up an attempt.
            peer = self.peers.get(origin) if origin else None
            if peer is not None:
                self.peer_table.send(peer, P.error_header(header.sender, unit_id, code, message, retry=True,
                                                     sender=f"meshd@{self.node_id}"))
            return code
        self._dead_letter(code, message, msg, header)
        sender = header.origin or header.sender
        if not isinstance(sender, str):
            return code
        if header.kind == Kind.BATCH:
            inner: list[tuple[Any, Any]] = []
            with contextlib.suppress(FrameError):
                inner = P.split_batch(msg)
            ids = [h.get(P.CORR) or h.get(P.ID) for h, _ in inner
                   if h.get(P.KIND) in (Kind.SEND, Kind.REQUEST)]
        elif header.kind in (Kind.SEND, Kind.REQUEST):
            ids = [header.corr or header.id]
        else:
            return code  # replies and errors never bounce: no loops
        ids = [i for i in ids if isinstance(i, str)]
        if not ids:
            return code
        # One envelope for the whole batch (``ids``), so a refused batch of 64 is one message back.
        err = P.error_header(sender, ids[0] if len(ids) == 1 else None, code, message, retry=retry,
                             retry_after=retry_after, sender=f"meshd@{self.node_id}")
        if len(ids) > 1:
            err[P.IDS] = ids
        self._route(sender, P.header_from_map(err), P.frames(err))
        return code

    # ----------------------------------------------------------------------------- qos 1

    def _rid_alive(self, rid: bytes) -> bool:
        agent = self.local_by_rid.get(rid)
        return agent is not None and self._agent_alive(agent)

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and not self._stopping:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_delivery)

    def _flush_delivery(self) -> None:
        self._flush_scheduled = False
        try:
            self.qos.flush()
        except Exception:
            # The disk failed us: nothing staged is confirmed; clients time out and may retry.
            log.exception("qos-1 commit failed")
            self.stats["qos1_commit_failed"] += 1
            return
        after, self._after_flush = self._after_flush, []
        for action in after:
            action()

    def _qos_attempt(self, entry: OutboxEntry) -> None:
        try:
            header = P.decode_header(entry.frames[1])
        except FrameError:
            self.qos.store.remove(entry.id)
            return
        self._route(entry.dest, header, entry.frames)

    def _qos_confirm(self, rid: bytes, unit_id: str) -> None:
        self._send_agent(rid, {P.KIND: Kind.OK, P.CORR: unit_id, P.QOS: 1})

    def _qos_send_acks(self, origin: str, ids: list[str]) -> None:
        if origin == self.node_id:
            self.qos.acks_arrived(ids)
            return
        peer = self.peers.get(origin)
        if peer is not None:
            self.peer_table.send(peer, {P.KIND: Kind.ACK, P.FROM: self.node_id, P.IDS: ids})

    def _qos_acked(self, entry: OutboxEntry) -> None:
        self.stats["qos1_delivered"] += 1
        if self.outcomes.enabled:
            self.outcomes.delivered(entry.id, entry.sender, entry.dest, entry.frames, entry.created)

    def _qos_give_up(self, entry: OutboxEntry, why: str) -> None:
        header: dict[str, Any] | None = None
        with contextlib.suppress(FrameError):
            header = P.unpack_header(entry.frames[1])
        self._dead_letter(P.ErrorCode.UNDELIVERABLE, f"to {entry.dest!r}: {why}", entry.frames, header,
                          attempts=entry.attempts)
        sender = self.local.get(entry.sender)
        if sender is not None:
            err = P.error_header(sender.name, entry.id, P.ErrorCode.UNDELIVERABLE,
                                 f"qos-1 message to {entry.dest!r}: {why}", sender=f"meshd@{self.node_id}")
            if header is not None and header.get(P.KIND) == Kind.BATCH:
                with contextlib.suppress(FrameError):  # name each message, not the batch
                    err[P.IDS] = [h.get(P.ID) for h, _ in P.split_batch(entry.frames)]
            self._send_agent(sender.rid, err)

    async def _qos_loop(self) -> None:
        ticks = 0
        while True:
            await asyncio.sleep(0.05)
            self.qos.tick()
            ticks += 1
            if self.outcomes.inflight and ticks % 20 == 0:
                self.outcomes.expire()
            if ticks % 1200 == 0:  # every minute
                self.qos.forget_delivering(older_than=max(600.0, 4 * self.settings.qos1_ack_timeout))
                self.qos.store.prune_seen()

    def _agent_event(self, agent: LocalAgent, old: str, new: str) -> None:
        self.plugins.agent_state({"name": agent.name, "node": self.node_id,
                                  "capabilities": list(agent.capabilities)}, old, new)

    def _dead_letter(self, reason: str, detail: str, frames: list[bytes],
                     header: P.Header | Mapping[str, Any] | None, attempts: int = 0) -> None:
        fields = header.fields if isinstance(header, P.Header) else header
        letter = self.dead_letters.add(reason, detail, frames, dict(fields) if fields else None, attempts)
        self.plugins.dead_letter(letter)

    # ----------------------------------------------------------------------------- admin

    def _admin(self, rid: bytes, msg_id: Any, header: P.Header, frames: list[bytes]) -> None:
        """meshctl's operations on this daemon (dead letters)."""
        op = header.get(P.OP)
        try:
            args = P.unpack_body(frames[3], 64 * 1024) if frames[3] else {}
        except FrameError as exc:
            self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, str(exc))
            return
        if not isinstance(args, dict):
            args = {}
        result: Any
        if op == "deadletters.list":
            result = [_letter_summary(d) for d in self.dead_letters.list()]
        elif op == "deadletters.show":
            seq = args.get("seq")
            letter = self.dead_letters.get(seq) if isinstance(seq, int) else None
            if letter is None:
                self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                       f"no dead letter {args.get('seq')!r}")
                return
            result = _letter_summary(letter) | {"frames": letter["frames"]}
        elif op == "deadletters.replay":
            result = self._replay(args)
        elif op == "deadletters.purge":
            result = {"purged": self.dead_letters.purge()}
        else:
            self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, f"unknown admin op {op!r}")
            return
        self._send_agent(rid, {P.KIND: Kind.OK, P.CORR: msg_id}, P.pack(result))

    def _replay(self, args: dict[str, Any]) -> dict[str, Any]:
        """Send dead letters again (one by seq, or all matching a reason / destination)."""
        seq = args.get("seq")
        reason = args.get("reason")
        to = args.get("to")
        chosen = []
        for letter in self.dead_letters.list():
            if seq is not None and letter["seq"] != seq:
                continue
            if reason and letter["reason"] != reason:
                continue
            header = letter["header"]
            if not isinstance(header, dict) or header.get(P.KIND) not in _REPLAYABLE:
                continue  # malformed input and control traffic cannot be replayed
            if to and header.get(P.TO) != to:
                continue
            chosen.append(letter)
        replayed = 0
        for letter in chosen:
            fields = dict(letter["header"])
            dest = fields.get(P.TO)
            if not isinstance(dest, str):
                continue
            fields[P.ID] = P.new_id()  # a fresh unit: the receiver may have seen the old id
            try:
                header = P.header_from_map(fields)
            except FrameError:
                continue  # kept for inspection; it cannot travel again
            self.dead_letters.pop(letter["seq"])
            frames = [P.SIGNATURE, P.pack(fields), *letter["frames"][2:]]
            if header.qos == 1:
                sender = self.local.get(str(header.sender))
                self.qos.accept(sender.rid if sender else b"", str(header.sender), fields[P.ID], dest,
                                frames)
            else:
                self._route(dest, header, frames)
            replayed += 1
        return {"replayed": replayed}

    def _send_agent_error(self, rid: bytes, corr: Any, code: str, message: str) -> None:
        err = P.error_header(None, corr if isinstance(corr, str) else None, code, message,
                             sender=f"meshd@{self.node_id}")
        self._send_agent(rid, err)

    def _send_agent(self, rid: bytes, header: Mapping[str, Any], body: bytes = b"") -> bool:
        try:
            self.agents_sock.send_multipart([rid, P.SIGNATURE, P.pack(header), body], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False
        finally:
            assert self._reactor is not None
            self._reactor.kick(self.agents_sock)

    def _on_agent_control(self, rid: bytes, agent: LocalAgent | None, kind: str,
                          header: P.Header, frames: list[bytes]) -> None:
        msg_id = header.id
        if kind == Kind.AGENT_HEARTBEAT:
            if agent is None:  # we restarted and forgot it: tell it to register again
                self._send_agent_error(rid, None, P.ErrorCode.NOT_REGISTERED, "not registered")
                return
            if agent is not None:
                with contextlib.suppress(FrameError):
                    telemetry = P.unpack_body(frames[3], 16 * 1024)
                    if isinstance(telemetry, dict):
                        agent.telemetry = telemetry
                if agent.state is not PeerState.ONLINE:
                    self._agent_event(agent, str(agent.state), "online")
                    agent.state = PeerState.ONLINE
                    self._directory_changed()  # peers show agent states too
            return
        if kind == Kind.REGISTER:
            self._register(rid, agent, msg_id, frames)
            return
        if kind == Kind.ACK:
            ids = header.get(P.IDS)
            if isinstance(ids, list):
                self.qos.agent_acked([i for i in ids if isinstance(i, str)])
            return
        if kind == Kind.ADMIN:
            self._admin(rid, msg_id, header, frames)
            return
        if kind == Kind.QUERY:
            what = header.get(P.WHAT)
            if what == "agents":
                body: Any = self.agent_list()
            elif what == "peers":
                body = self.peer_list()
            elif what == "node":
                body = self.node_info()
            else:
                self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, f"unknown query {what!r}")
                return
            self._send_agent(rid, {P.KIND: Kind.OK, P.CORR: msg_id}, P.pack(body))
            return
        if agent is None:
            self._send_agent_error(rid, msg_id, P.ErrorCode.NOT_REGISTERED, "register a name first")
            return
        if kind == Kind.UNREGISTER:
            self._remove_local(agent, "unregistered")
            self._send_agent(rid, {P.KIND: Kind.OK, P.CORR: msg_id})
            return
        topic = header.topic
        if not P.valid_topic(topic):
            self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, f"invalid topic {topic!r}")
            return
        if kind == Kind.SUBSCRIBE:
            self._subscribe(agent, str(topic), durable=header.qos == 1)
        else:
            self._unsubscribe(agent, str(topic))
        self._send_agent(rid, {P.KIND: Kind.OK, P.CORR: msg_id})

    def _register(self, rid: bytes, agent: LocalAgent | None, msg_id: Any, frames: list[bytes]) -> None:
        try:
            body = P.unpack_body(frames[3], 64 * 1024)
        except FrameError as exc:
            self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, str(exc))
            return
        name = body.get("name") if isinstance(body, dict) else None
        if not P.valid_name(name):
            self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                   f"invalid agent name {name!r}: 1-128 printable characters, "
                                   "no '@' or spaces")
            return
        assert isinstance(name, str) and isinstance(body, dict)
        caps = body.get("capabilities") or []
        meta = body.get("metadata") or {}
        caps_ok = isinstance(caps, list) and all(isinstance(c, str) for c in caps)
        if not caps_ok or not isinstance(meta, dict):
            self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                   "capabilities must be a list of strings, metadata a map")
            return
        if agent is not None and agent.name != name:
            self._send_agent_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                   f"this connection is already registered as {agent.name!r}")
            return
        holder = self.local.get(name)
        if holder is not None and holder.rid != rid:
            if self._agent_alive(holder):
                self._send_agent_error(rid, msg_id, P.ErrorCode.NAME_TAKEN,
                                       f"name {name!r} is taken on this node ({self.node_id})")
                return
            self._remove_local(holder, "replaced by a new connection")
        host = self.directory.host_of(name)
        peer = self.peers.get(host) if host is not None else None
        if peer is not None:
            self._send_agent_error(rid, msg_id, P.ErrorCode.NAME_TAKEN,
                                   f"name {name!r} is taken on node {peer.node_id} ({peer.name})")
            return
        if holder is None or holder.rid != rid:
            agent = LocalAgent(name=name, rid=rid, capabilities=caps, metadata=meta,
                               registered_at=time.time())
            self.directory.add_local(agent)
        else:
            holder.capabilities, holder.metadata = caps, meta
        self._directory_changed()
        log.info("agent %r registered", name)
        if holder is None or holder.rid != rid:
            self._agent_event(self.local[name], "absent", "online")
        self._send_agent(rid, {P.KIND: Kind.OK, P.CORR: msg_id},
                         P.pack({"node": self.node_id, "node_name": self.name, "mesh": self.settings.mesh}))

    def _agent_alive(self, agent: LocalAgent) -> bool:
        """Probe with a PING: ROUTER_MANDATORY says at once whether the connection still exists."""
        try:
            self.agents_sock.send_multipart([agent.rid, P.SIGNATURE, P.pack({P.KIND: Kind.PING}), b""],
                                            zmq.NOBLOCK)
            return True
        except zmq.Again:
            return True  # connected but busy
        except zmq.ZMQError:
            return False

    def _remove_local(self, agent: LocalAgent, why: str) -> None:
        dropped = self.directory.remove_local(agent)
        if dropped is None:
            return
        self._sub_keys(dropped, zmq.UNSUBSCRIBE)
        log.info("agent %r removed: %s", agent.name, why)
        self._agent_event(agent, str(agent.state), "absent")
        self._directory_changed()

    def _evict_local(self, agent: LocalAgent, why: str) -> None:
        err = P.error_header(agent.name, None, P.ErrorCode.NAME_TAKEN, why, sender=f"meshd@{self.node_id}")
        self._send_agent(agent.rid, err)
        self._remove_local(agent, why)

    def _on_agent_monitor(self, frames: list[bytes]) -> None:
        # An agent connection closed; find out which by probing (MANDATORY reports the dead one).
        # libzmq may still be tearing the pipe down, so probe again a moment later.
        loop = asyncio.get_running_loop()
        self._probe_agents()
        loop.call_later(0.05, self._probe_agents)
        loop.call_later(0.5, self._probe_agents)

    def _probe_agents(self) -> None:
        if self._stopping:
            return
        for agent in list(self.local.values()):
            if not self._agent_alive(agent):
                self._remove_local(agent, "disconnected")
        assert self._reactor is not None
        self._reactor.kick(self.agents_sock)

    def _directory_changed(self) -> None:
        self.directory.bump()
        body = P.pack(self.directory.body())
        header = {P.KIND: Kind.DIRECTORY, P.FROM: self.node_id, P.VER: self.directory.version}
        for peer in self.peers.values():
            if peer.greeted and peer.state is not PeerState.OFFLINE:
                self.peer_table.send(peer, header, body)

    # ----------------------------------------------------------------------------- topics

    def _subscribe(self, agent: LocalAgent, topic: str, durable: bool = False) -> None:
        changed, key = self.directory.subscribe(agent, topic, durable)
        if key is not None:
            self._sub_keys([key], zmq.SUBSCRIBE)
        if changed:
            self._directory_changed()

    def _unsubscribe(self, agent: LocalAgent, topic: str) -> None:
        changed, key = self.directory.unsubscribe(agent, topic)
        if key is not None:
            self._sub_keys([key], zmq.UNSUBSCRIBE)
        if changed:
            self._directory_changed()

    def _sub_keys(self, keys: list[bytes], option: int) -> None:
        """(Un)subscribe every peer's SUB socket: filtering happens at the publisher."""
        for key in keys:
            for peer in self.peers.values():
                if peer.sub is not None:
                    peer.sub.setsockopt(option, key)

    def _publish(self, agent: LocalAgent, topic: str, header: P.Header, msg: list[bytes]) -> None:
        """Fan a publication out: PUB/SUB for everyone, and for a qos-1 publication one outbox
        unit per durable subscriber (who then gets it only that way, exactly once)."""
        reached = 0
        durable: list[str] = []
        if header.qos == 1:
            durable = self.directory.durable_subscribers(topic)
            unit_id = str(header.id)
            for name in durable:
                unit_header = dict(header.fields)
                unit_header[P.TO] = name
                unit_header[P.ID] = f"{unit_id}>{name}"
                self.qos.accept(None, agent.name, unit_header[P.ID], name,
                                [P.SIGNATURE, P.pack(unit_header), *msg[2:]])
            reached += len(durable)
        skip = set(durable)
        for sub in self.directory.local_topics.get(topic, ()):
            if sub.name in skip:
                continue
            try:
                self.agents_sock.send_multipart([sub.rid, *msg], zmq.NOBLOCK)
                reached += 1
            except zmq.ZMQError:
                self.stats["publish_local_dropped"] += 1
        remote = self.directory.remote_subscribers(topic) - sum(1 for n in durable if n not in self.local)
        if remote > 0:
            try:
                self.xpub.send_multipart([P.topic_key(topic), *msg], zmq.NOBLOCK)
                reached += remote
            except zmq.ZMQError:
                self.stats["publish_remote_dropped"] += 1
            assert self._reactor is not None
            self._reactor.kick(self.xpub)
        self.stats["published"] += 1
        ack = {P.KIND: Kind.OK, P.CORR: header.id, P.COUNT: reached}
        if durable:  # confirmed once the durable copies are on disk
            self._after_flush.append(functools.partial(self._send_agent, agent.rid, ack))
            self._schedule_flush()
        else:
            self._send_agent(agent.rid, ack)

    def _on_topic(self, frames: list[bytes]) -> None:
        """A publication from a peer's XPUB: hand it to the local subscribers."""
        subs = self.directory.local_topic_keys.get(frames[0])
        if not subs or len(frames) < 4 or frames[1] != P.SIGNATURE:
            self.stats["topic_dropped"] += 1
            return
        msg = frames[1:]
        qos1: bool | None = None
        for sub in list(subs):
            if sub.durable and qos1 is None:
                try:
                    qos1 = P.unpack_header(msg[1]).get(P.QOS) == 1
                except FrameError:
                    qos1 = False
            if qos1 and sub.durable and any(k == frames[0] for k in map(P.topic_key, sub.durable)):
                continue  # it gets its own qos-1 copy from the publisher's outbox
            try:
                self.agents_sock.send_multipart([sub.rid, *msg], zmq.NOBLOCK)
            except zmq.ZMQError:
                self.stats["publish_local_dropped"] += 1
        assert self._reactor is not None
        self._reactor.kick(self.agents_sock)

    def _on_xpub(self, frames: list[bytes]) -> None:
        # Subscription notices from peers' SUBs; the XPUB applies them itself, we only count.
        self.stats["subscription_notices"] += 1

    # ----------------------------------------------------------------------------- errors

    def _reject(self, exc: FrameError, frames: list[bytes], origin: str,
                header: P.Header | Mapping[str, Any] | None = None) -> None:
        """A malformed frame set: count it, keep it as a dead letter, log once per reason."""
        self.stats["malformed"] += 1
        self.stats[f"malformed_{exc.reason}"] += 1
        self._dead_letter(f"malformed:{exc.reason}", f"from {origin}: {exc}", frames[1:], header)
        self._log_once(f"malformed:{exc.reason}:{origin}", "dropped malformed message from %s: %s",
                       origin, exc)

    # ----------------------------------------------------------------------------- timers

    async def _heartbeat_loop(self) -> None:
        while True:
            self.peer_table.beat()
            await asyncio.sleep(self.settings.heartbeat_interval)

    def status_line(self) -> str:
        """One line for systemd's STATUS= and logs: peers and agents counted."""
        online = sum(1 for p in self.peers.values() if p.state is PeerState.ONLINE)
        remote = self.directory.remote_count()
        return (f"{online}/{len(self.peers)} peers online, {len(self.local)} local agents, "
                f"{remote} remote agents, mesh {self.settings.mesh!r}")

    async def _status_loop(self) -> None:
        """STATUS= when it changes (checked every second) and WATCHDOG=1 at half of WatchdogSec."""
        watchdog = self.notifier.watchdog_interval()
        tick = min(1.0, watchdog) if watchdog else 1.0
        last_status = ""
        last_ping = 0.0
        while True:
            line = self.status_line()
            if line != last_status:
                self.notifier.status(line)
                last_status = line
            now = time.monotonic()
            if watchdog and now - last_ping >= watchdog:
                # The loop turning is the health signal: a wedged routing loop stops the pings.
                self.notifier.watchdog()
                last_ping = now
            await asyncio.sleep(tick)

    async def _trust_loop(self) -> None:
        """Apply changes to the authorized-keys folder without a restart."""
        while True:
            await asyncio.sleep(1.0)
            try:
                changed = self.security.reload()
            except OSError as exc:
                self._log_once(f"trust:{exc}", "cannot read authorized keys: %s", exc)
                continue
            if changed:
                self.apply_trust_change()

    def apply_trust_change(self) -> None:
        """Cut off peers whose key is no longer trusted; dial discovered ones that now are."""
        self.peer_table.apply_trust_change()

    async def _liveness_loop(self) -> None:
        s = self.settings
        tick = min(0.25, s.heartbeat_interval / 2)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            self.peer_table.check_liveness(now)
            for agent in list(self.local.values()):
                age = now - agent.last_seen
                state = next_state(agent.state, age, s.stale_after, s.offline_after)
                if state is PeerState.OFFLINE:
                    self._remove_local(agent, f"no heartbeat for {age:.1f} s")
                elif state is PeerState.STALE:
                    self._agent_event(agent, str(agent.state), "stale")
                    agent.state = PeerState.STALE
                    self._directory_changed()

    # ----------------------------------------------------------------------------- queries

    def _telemetry_body(self) -> dict[str, Any]:
        return {a.name: {"state": str(a.state), "telemetry": a.telemetry} for a in self.local.values()}

    def agent_list(self) -> list[dict[str, Any]]:
        agents = [a.record(self.node_id) | {"node_name": self.name} for a in self.local.values()]
        for peer in self.peers.values():
            if peer.state is PeerState.OFFLINE:
                continue
            for name, rec in self.directory.records_of(peer.node_id).items():
                live = peer.telemetry.get(name)
                extra = live if isinstance(live, dict) else {}
                agents.append(dict(rec) | extra | {"node": peer.node_id, "node_name": peer.name})
        return sorted(agents, key=lambda r: str(r.get("name")))

    def peer_list(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return sorted((p.info(now, len(self.directory.records_of(p.node_id))) for p in self.peers.values()),
                      key=lambda r: r["node"])

    def node_info(self) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "name": self.name,
            "mesh": self.settings.mesh,
            "routers": self.router_endpoints(),
            "pubs": self.pub_endpoints(),
            "socket": str(self.socket_path),
            "insecure": self.settings.insecure,
            "trust_mode": None if self.settings.insecure else self.settings.trust_mode,
            "public_key": self.security.public_key,
            "auth": self.security.stats(),
            "uptime": round(time.monotonic() - self.started_at, 3),
            "agents": len(self.local),
            "peers": sum(1 for p in self.peers.values() if p.state is PeerState.ONLINE),
            "stats": dict(self.stats),
            "dead_letters": self.dead_letters.total,
            "plugins": {"stats": dict(self.plugins.stats), "queued": self.plugins.queued,
                        "loaded": [p["name"] for p in self.plugins.list_plugins()
                                   if p["status"] == "loaded"]},
            "qos1": {"pending": self.qos.pending, "in_flight": self.qos.in_flight, **self.qos.stats,
                     "commits": self.qos.store.commits},
        }
