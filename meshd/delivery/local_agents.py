"""The local agent socket: the link to it, and its control plane (register, heartbeats, subscribe).

Owns: :class:`AgentLink` (sending on the local ipc ROUTER: one place that frames a message for an
agent and kicks the reactor) and :class:`LocalAgents` (agent control messages: register with the
name rules, unregister, agent heartbeats and telemetry, subscribe/unsubscribe, acks of qos-1
units, queries and admin calls handed to admin.py; probing for agents whose connection closed;
telling peers when the local directory changed). The records themselves live in directory.py.
It must not route messages (routing.py) or touch the qos-1 outbox beyond reporting agent acks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from meshd import transport
from meshd.delivery.handover import AgentHandover
from meshd.mesh.directory import Directory, LocalAgent, topic_cost
from meshd.mesh.directory_updates import DirectoryUpdates
from meshd.mesh.liveness import PeerState, next_state
from meshd.mesh.peers import PeerTable
from meshd.plugins.host import PluginHost
from meshd.util.priority import PriorityFifo
from meshd.util.shutdown import Shutdown
from meshd.wire import protocol as P
from meshd.wire import topics as T
from meshd.wire.contracts import check_records, contracts_digest
from meshd.wire.protocol import FrameError, Kind
from meshd.wire.system_names import SYSTEM_PREFIX

if TYPE_CHECKING:
    from meshd.config.settings import Settings  # pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.delivery.qos1_driver import Qos1Driver

__all__ = ["AgentLink", "LocalAgents"]

log = logging.getLogger("meshd.node")


class AgentLink:
    """The local agent ROUTER (ipc, mode 0660): every message to a local agent leaves here.

    Answers (``ok``, daemon errors, error notices and replies routed to an agent) have a lane
    of their own: what the connection's inbox (``inbox_cap``, the socket's high-water mark)
    refuses waits here, per connection, and goes out first as the agent reads; while some wait,
    data for that connection is refused (``has_backlog``) so the answers cannot starve.

    Two bounds per connection, each ``backlog_max``: answers to calls, and *notices* (an error
    whose ``error`` map says ``notice``: it answers nothing the client awaits, such as
    ``INBOX_FULL`` for a qos-0 send, a publisher's pause or a gap notice). Past its bound an
    answer is dropped and counted (``answers_dropped``), a notice likewise (``notices_dropped``):
    a client that keeps at most ``backlog_max`` calls in flight loses no answer, however many
    notices its fire-and-forget sends cause.

    Urgent data (qos 0, priority 0-4) that a full inbox refuses waits here too, per connection
    (``urgent_max``, ``priority_hold_max``), lowest priority number first and FIFO within one, and
    goes out right after the answers, ahead of any other data (``hold_urgent``).

    Credit mode (a connection that asked for it at register, ``open_credit``): data is written
    into the connection's pipe only while fewer than its window are written and not yet read
    (the agent's ``credit`` messages and heartbeats say how many it has read). The rest waits
    here, ``inbox_cap`` per connection (``send_data`` is False past it: INBOX_FULL; urgent data,
    priority 0-4, has ``priority_hold_max`` more room, as without credit), lowest
    priority number first, FIFO within one, and goes out as the agent grants credit, after any
    answers waiting for it.
    """

    FLUSH_INTERVAL = 0.005

    def __init__(self, sock: zmq.Socket[Any], reactor: transport.Reactor, node_id: str, *,
                 backlog_max: int = 1000, urgent_max: int = 256, held_max: int = 100,
                 stats: Counter[str] | None = None) -> None:
        self.sock = sock
        #: ``sock.send_multipart(frames, NOBLOCK)`` without pyzmq's Python layer (transport.send_frames)
        self.send_now = transport.frame_sender(sock)
        self._hand_over: Callable[[list[bytes]], bool] | None = getattr(sock, "hand_over", None)
        self.reactor = reactor
        self.node_id = node_id
        self.backlog_max = backlog_max
        self.stats: Counter[str] = stats if stats is not None else Counter()
        # rid -> (frames, is a notice) waiting, and how many of them are notices
        self._backlog: dict[bytes, deque[tuple[list[bytes], bool]]] = {}
        self._notices: Counter[bytes] = Counter()
        self.urgent_max = urgent_max
        # rid -> urgent data waiting (frames with their priority), served by priority
        self._urgent: dict[bytes, PriorityFifo[tuple[int, list[bytes]]]] = {}
        self._flush_timer: asyncio.TimerHandle | None = None
        # credit mode: rid -> [window, written, read]; rid -> data waiting for credit
        self._credit: dict[bytes, list[int]] = {}
        self._held: dict[bytes, PriorityFifo[tuple[int, list[bytes], int]]] = {}
        self.held_max = held_max  # credit mode: data waiting in the daemon per connection (inbox_cap)

    def open_credit(self, rid: bytes, window: int) -> None:
        """Credit mode for this connection with ``window`` data messages in its pipe at most
        (a register again keeps what was counted, with the new window)."""
        state = self._credit.get(rid)
        if state is None:
            self._credit[rid] = [window, 0, 0]
        else:
            state[0] = window

    def in_credit_mode(self, rid: bytes) -> bool:
        return rid in self._credit

    def granted(self, rid: bytes, read: object) -> None:
        """The agent says its reads took ``read`` credit in all (``credit``, docs/PROTOCOL.md §8.11)."""
        state = self._credit.get(rid)
        if state is None or type(read) is not int:
            return
        if read > state[2]:
            state[2] = min(read, state[1])  # never credit for more than was written
        # Also when nothing new was read (a heartbeat's resync): what waits goes out if the
        # window or the pipe has room again.
        self._send_held(rid)

    def send_data(self, frames: list[bytes], priority: int, count: int = 1) -> bool:
        """Data (``[rid, signature, header, payload]``, ``count`` work messages) for a connection
        in credit mode: written now if its window has room and nothing waits, else kept in
        priority order; False past ``held_max`` (``inbox_cap``) waiting, or for urgent data
        (priority 0-4) past ``held_max + urgent_max`` (``priority_hold_max``), as without credit."""
        rid = frames[0]
        state = self._credit[rid]
        held = self._held.get(rid)
        if held is None and rid not in self._backlog and (not count or state[1] - state[2] < state[0]):
            try:
                self.send_now(frames)
                state[1] += count
                return True
            except zmq.Again:
                # The pipe is full with room in the window (answers, notices or publications,
                # which take no credit, fill it): no grant may come, so a flush retries it.
                self._schedule_flush()
            finally:
                self.reactor.kick(self.sock)
        if held is None:
            held = self._held[rid] = PriorityFifo(_first_of)
        elif len(held) >= self.held_max + (self.urgent_max if priority < P.DEFAULT_PRIORITY else 0):
            self.stats["credit_refused"] += 1
            return False
        held.append((priority, frames, count))
        self.stats["credit_held"] += 1
        return True

    def _send_held(self, rid: bytes) -> None:
        held = self._held.get(rid)
        if held is None or rid in self._backlog:
            return
        state = self._credit[rid]
        try:
            while held:
                _prio, frames, count = held.peek()
                if count and state[1] - state[2] >= state[0]:
                    break
                self.send_now(frames)
                held.popleft()
                state[1] += count
                self.stats["credit_delivered"] += 1
        except zmq.Again:
            self._schedule_flush()
            return
        except zmq.ZMQError:
            self.stats["credit_dropped"] += len(held)  # the connection is gone
            held = PriorityFifo(_first_of)
        finally:
            self.reactor.kick(self.sock)
        if not held:
            del self._held[rid]

    def kick(self) -> None:
        """Re-check the socket after sends (its FD is edge-triggered)."""
        self.reactor.kick(self.sock)

    def send(self, rid: bytes, header: Mapping[str, Any], body: bytes = b"") -> bool:
        return self.send_answer([rid, *P.frames(header, body)], notice=P.is_notice(header))

    def has_backlog(self, rid: bytes) -> bool:
        """Answers or urgent data wait for this connection: other data must not overtake them."""
        return rid in self._backlog or rid in self._urgent or rid in self._held

    def hold_urgent(self, frames: list[bytes], priority: int) -> bool:
        """Keep urgent data (``[rid, signature, header, payload]``, priority below the default) that
        the full inbox refused, to go out ahead of other data; False past ``urgent_max``."""
        rid = frames[0]
        waiting = self._urgent.get(rid)
        if waiting is None:
            if self.urgent_max <= 0:
                return False
            waiting = self._urgent[rid] = PriorityFifo(_first)
        elif len(waiting) >= self.urgent_max:
            self.stats["urgent_refused"] += 1
            return False
        waiting.append((priority, frames))
        self.stats["urgent_held"] += 1
        self._schedule_flush()
        return True

    def send_answer(self, frames: list[bytes], reply: bool = False, notice: bool = False) -> bool:
        """Send ``[rid, signature, header, payload]`` now, or keep it until the agent reads.

        ``reply``: a routed reply, which an in-process agent may take at once (its socket stand-in's
        ``hand_over``, meshd/daemon/embedded.py: no loop turn). ``notice``: it answers no call (its own
        bound). False if the connection is gone or its bound is reached (counted)."""
        rid = frames[0]
        waiting = self._backlog.get(rid)
        if reply and waiting is None and self._hand_over is not None and self._hand_over(frames):
            return True
        if waiting is None:
            try:
                self.send_now(frames)
                return True
            except zmq.Again:
                waiting = self._backlog[rid] = deque()
                self._schedule_flush()
            except zmq.ZMQError:
                return False  # the connection is gone
            finally:
                self.reactor.kick(self.sock)
        notices = self._notices[rid]
        if notice:
            if notices >= self.backlog_max:
                self.stats["notices_dropped"] += 1
                return False
            self._notices[rid] = notices + 1
        elif len(waiting) - notices >= self.backlog_max:
            self.stats["answers_dropped"] += 1
            return False
        waiting.append((frames, notice))
        self.stats["answers_held"] += 1
        return True

    def _schedule_flush(self) -> None:
        if self._flush_timer is None:
            with contextlib.suppress(RuntimeError):  # no loop: nothing to flush later
                self._flush_timer = asyncio.get_running_loop().call_later(self.FLUSH_INTERVAL,
                                                                          self.flush_backlog)

    def flush_backlog(self) -> None:
        """Send what waits, oldest first, as far as each connection's inbox takes it."""
        self._flush_timer = None
        for rid, waiting in list(self._backlog.items()):
            try:
                while waiting:
                    frames, notice = waiting[0]
                    self.send_now(frames)
                    waiting.popleft()
                    if notice:
                        self._notices[rid] -= 1
            except zmq.Again:
                continue
            except zmq.ZMQError:
                notices = self._notices[rid]  # the connection is gone
                self.stats["notices_dropped"] += notices
                self.stats["answers_dropped"] += len(waiting) - notices
                waiting.clear()
            del self._backlog[rid]
            self._notices.pop(rid, None)
        for rid, urgent in list(self._urgent.items()):
            if rid in self._backlog:
                continue  # answers first
            try:
                while urgent:
                    self.send_now(urgent.peek()[1])
                    urgent.popleft()
                    self.stats["urgent_delivered"] += 1
            except zmq.Again:
                continue
            except zmq.ZMQError:
                self.stats["urgent_dropped"] += len(urgent)  # the connection is gone
            del self._urgent[rid]
        for rid in list(self._held):
            self._send_held(rid)
        self.reactor.kick(self.sock)
        if self._backlog or self._urgent:
            self._schedule_flush()

    @property
    def backlog_empty(self) -> bool:
        """No answer waits for any connection."""
        return not self._backlog

    def forget(self, rid: bytes) -> None:
        """The connection left: drop what waited for it."""
        self._backlog.pop(rid, None)
        self._notices.pop(rid, None)
        dropped = self._urgent.pop(rid, None)
        if dropped:
            self.stats["urgent_dropped"] += len(dropped)
        self._credit.pop(rid, None)
        held = self._held.pop(rid, None)
        if held:
            self.stats["credit_dropped"] += len(held)

    def send_error(self, rid: bytes, corr: Any, code: str, message: str, *,
                   retry_after: float | None = None) -> None:
        """An error envelope from this daemon on the connection ``rid`` (no routing); with
        ``retry_after`` it is marked retryable."""
        err = P.error_header(None, corr if isinstance(corr, str) else None, code, message,
                             retry=retry_after is not None, retry_after=retry_after,
                             sender=f"meshd@{self.node_id}")
        self.send(rid, err)


def _first(item: tuple[int, list[bytes]]) -> int:
    return item[0]


def _first_of(item: tuple[int, list[bytes], int]) -> int:
    return item[0]


class AdminDesk(Protocol):
    """What agent control hands on to meshctl's side (meshd.daemon.admin.Admin): operations
    and the listings of ``agents`` and ``peers``."""

    def handle(self, rid: bytes, msg_id: Any, header: P.Header, frames: list[bytes]) -> None: ...
    def agent_list(self) -> list[dict[str, Any]]: ...
    def peer_list(self) -> list[dict[str, Any]]: ...


class LocalAgents:
    """Agent control on the local socket; the agent records live in the :class:`Directory`."""

    def __init__(self, settings: Settings, *, node_id: str, name: str, directory: Directory,
                 peer_table: PeerTable, link: AgentLink, plugins: PluginHost, stats: Counter[str],
                 node_info: Callable[[], dict[str, Any]], qos: Qos1Driver, admin: AdminDesk,
                 updates: DirectoryUpdates, system_token: str, shutdown: Shutdown,
                 settled: Callable[[], bool] | None = None,
                 stays_attached: Callable[[bytes], bool] | None = None) -> None:
        self.settings = settings
        self.node_id = node_id
        self.name = name
        #: Only the daemon's own system agent (meshd/tools/service.py) knows this: the
        #: ``meshd.sys.`` names are the daemons' own.
        self.system_token = system_token
        self.directory = directory
        self.peer_table = peer_table
        self.peers = peer_table.peers
        self.link = link
        self.plugins = plugins
        self.stats = stats
        self.node_info = node_info
        self.qos = qos
        self.admin = admin
        self.updates = updates
        self.shutdown = shutdown
        #: Telling agents that this daemon stops, and waiting for their answers (meshd/delivery/handover.py).
        self.handover = AgentHandover(link, directory, stats, register=self.register_later,
                                      settled=settled, stays_attached=stays_attached)

    @property
    def stopping(self) -> bool:
        return self.shutdown.begun

    def on_control(self, rid: bytes, agent: LocalAgent | None, kind: str,
                          header: P.Header, frames: list[bytes]) -> None:
        msg_id = header.id
        if kind == Kind.AGENT_HEARTBEAT:
            if agent is None:  # we restarted and forgot it: tell it to register again
                self.link.send_error(rid, None, P.ErrorCode.NOT_REGISTERED, "not registered")
                return
            if agent is not None:
                with contextlib.suppress(FrameError):
                    telemetry = P.unpack_body(frames[3], 16 * 1024)
                    if isinstance(telemetry, dict):
                        agent.telemetry = telemetry
                        self.link.granted(rid, telemetry.get("credit_read"))  # credit mode: a resync
                if agent.state is not PeerState.ONLINE:
                    self.agent_event(agent, str(agent.state), "online")
                    agent.state = PeerState.ONLINE
                    self.directory_changed(agent)  # peers show agent states too
            return
        if kind == Kind.REGISTER:
            if self.stopping:  # the answer to the stop notice: refused, the next daemon registers it
                self.handover.answered(rid, msg_id)
                return
            if self.handover.defer(rid, msg_id, frames):  # starting: answered at READY
                return
            self.register(rid, agent, msg_id, frames)
            return
        if kind == Kind.CREDIT:
            if agent is not None:
                self.link.granted(rid, header.get(P.READ))
            return
        if kind == Kind.ACK:
            ids = header.get(P.IDS)
            if isinstance(ids, list):
                self.qos.agent_acked([i for i in ids if isinstance(i, str)])
            return
        if kind == Kind.NACK:
            err = header.get(P.ERROR)
            if isinstance(header.id, str) and isinstance(err, dict):
                self.stats["agent_nacks"] += 1
                self.qos.agent_nacked(header.id, err)
            return
        if kind == Kind.ADMIN:
            self.admin.handle(rid, msg_id, header, frames)
            return
        if kind == Kind.QUERY:
            what = header.get(P.WHAT)
            if what == "agents":
                body: Any = self.admin.agent_list()
            elif what == "peers":
                body = self.admin.peer_list()
            elif what == "node":
                body = self.node_info()
            elif what == "contracts":
                found = self.contracts_of(header.to)
                if found is None:
                    self.link.send_error(rid, msg_id, P.ErrorCode.NO_SUCH_AGENT,
                                         f"no agent {P.safe_repr(header.to)} in the directory")
                    return
                body = found
            else:
                self.stats["refused_control"] += 1
                self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                     f"unknown query {P.safe_repr(what)}")
                return
            self.link.send(rid, {P.KIND: Kind.OK, P.CORR: msg_id}, P.pack(body))
            return
        if agent is None:
            self.link.send_error(rid, msg_id, P.ErrorCode.NOT_REGISTERED, "register a name first")
            return
        if kind == Kind.UNREGISTER:
            self.remove(agent, "unregistered")
            self.link.send(rid, {P.KIND: Kind.OK, P.CORR: msg_id})
            return
        topic = header.topic
        if not P.valid_topic(topic):
            self.stats["refused_control"] += 1
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                 f"invalid topic {P.safe_repr(topic)}")
            return
        if kind == Kind.SUBSCRIBE:
            malformed = self.pattern_malformed(str(topic))
            if malformed is not None:
                self.stats["refused_pattern"] += 1
                self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, malformed)
                return
            refused = self.subscription_refused(agent, str(topic), durable=header.qos == 1)
            if refused is not None:
                self.stats["refused_directory_bound"] += 1
                self.link.send_error(rid, msg_id, P.ErrorCode.TOO_LARGE, refused)
                return
            self.subscribe(agent, str(topic), durable=header.qos == 1)
        else:
            self.unsubscribe(agent, str(topic))
        self.link.send(rid, {P.KIND: Kind.OK, P.CORR: msg_id})

    def register_later(self, rid: bytes, msg_id: Any, frames: list[bytes]) -> None:
        """A registration deferred while the daemon started (meshd/delivery/handover.py)."""
        self.register(rid, self.directory.local_by_rid.get(rid), msg_id, frames)

    def register(self, rid: bytes, agent: LocalAgent | None, msg_id: Any, frames: list[bytes]) -> None:
        try:
            body = P.unpack_body(frames[3], 64 * 1024 + self.settings.contracts_max_bytes)
        except FrameError as exc:
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, str(exc))
            return
        name = body.get("name") if isinstance(body, dict) else None
        if not P.valid_name(name):
            self.stats["refused_control"] += 1
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                   f"invalid agent name {P.safe_repr(name)}: 1-128 printable characters, "
                                   "no '@' or spaces")
            return
        assert isinstance(name, str) and isinstance(body, dict)
        caps = body.get("capabilities") or []
        meta = body.get("metadata") or {}
        caps_ok = isinstance(caps, list) and all(isinstance(c, str) for c in caps)
        if not caps_ok or not isinstance(meta, dict):
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                   "capabilities must be a list of strings, metadata a map")
            return
        credit = body.get("credit")
        if credit is not None and (type(credit) is not int or not 1 <= credit <= P.MAX_CREDIT):
            self.stats["refused_control"] += 1
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                 f"credit must be an integer 1..{P.MAX_CREDIT}, not {P.safe_repr(credit)}")
            return
        contracts = body.get("contracts") or []
        bad_contracts = check_records(contracts)
        if bad_contracts is not None:
            self.stats["refused_control"] += 1
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, bad_contracts)
            return
        contract_bytes = len(P.pack(contracts)) if contracts else 0
        if contract_bytes > self.settings.contracts_max_bytes:
            self.stats["refused_directory_bound"] += 1
            self.link.send_error(rid, msg_id, P.ErrorCode.TOO_LARGE,
                                 f"contracts take {contract_bytes} bytes; the limit is "
                                 f"contracts_max_bytes={self.settings.contracts_max_bytes}")
            return
        # The meshd.sys. prefix is the daemons' own; only our system agent, which knows the token,
        # may register it (the token is not kept in the directory).
        token = meta.pop("meshd.sys.token", None)
        if name.startswith(SYSTEM_PREFIX) and (not self.system_token or token != self.system_token):
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                 f"agent names starting with {SYSTEM_PREFIX!r} are reserved for daemons")
            return
        if agent is not None and agent.name != name:
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                   f"this connection is already registered as {agent.name!r}")
            return
        holder = self.directory.local.get(name)
        if holder is not None and holder.rid != rid:
            if self.alive(holder):
                self.link.send_error(rid, msg_id, P.ErrorCode.NAME_TAKEN,
                                       f"name {name!r} is taken on this node ({self.node_id})")
                return
            self.remove(holder, "replaced by a new connection")
        host = self.directory.host_of(name)
        peer = self.peers.get(host) if host is not None else None
        if peer is not None:
            self.link.send_error(rid, msg_id, P.ErrorCode.NAME_TAKEN,
                                   f"name {name!r} is taken on node {peer.node_id} ({peer.name})")
            return
        refused = self.registration_refused(agent, name, caps, meta, contracts)
        if refused is not None:
            self.stats["refused_directory_bound"] += 1
            self.link.send_error(rid, msg_id, P.ErrorCode.TOO_LARGE, refused)
            return
        digest = contracts_digest(contracts) if contracts else ""
        if holder is None or holder.rid != rid:
            agent = LocalAgent(name=name, rid=rid, capabilities=caps, metadata=meta,
                               registered_at=time.time(),  # shown to people only
                               reg=self.directory.next_reg(),  # what a name conflict compares
                               contracts=contracts, contracts_digest=digest)
            self.directory.add_local(agent)
        else:
            changed = digest != holder.contracts_digest
            holder.capabilities, holder.metadata = caps, meta
            holder.contracts, holder.contracts_digest = contracts, digest
            self.directory.recount(holder)
            if changed:  # contracts travel only in whole records
                self.directory.journal.whole(name)
        self.directory_changed()
        log.info("agent %r registered", name)
        if holder is None or holder.rid != rid:
            self.agent_event(self.directory.local[name], "absent", "online")
        s = self.settings
        extra: dict[str, Any] = {}
        if credit is not None and s.agent_credit_max > 0:
            window = min(credit, s.agent_credit_max)
            self.link.open_credit(rid, window)
            extra["credit"] = window  # the client is in credit mode only if the answer says so
        self.link.send(rid, {P.KIND: Kind.OK, P.CORR: msg_id}, P.pack(extra | {
            "node": self.node_id, "node_name": self.name, "mesh": s.mesh,
            # What a client needs to behave without guessing: its liveness timers, the inbox
            # it may fill, and the size limits the daemon enforces on it.
            "heartbeat_interval": s.heartbeat_interval, "stale_after": s.stale_after,
            "offline_after": s.offline_after, "inbox_cap": s.inbox_cap,
            "max_payload_bytes": s.max_payload_bytes, "max_header_bytes": P.MAX_HEADER_BYTES,
            "max_batch": P.MAX_BATCH, "hop_limit": s.hop_limit,
            # Calls a client may keep in flight and still get every answer: the answer backlog.
            "in_flight_max": s.agent_answer_backlog}))

    def registration_refused(self, agent: LocalAgent | None, name: str, caps: list[str],
                             meta: dict[str, Any],
                             contracts: list[dict[str, Any]] | None = None) -> str | None:
        """Why this registration would pass a directory bound (TOO_LARGE), or None."""
        s = self.settings
        own = len(P.pack([caps, meta]))
        if own > s.agent_metadata_max_bytes:
            return (f"capabilities and metadata take {own} bytes; the limit is "
                    f"agent_metadata_max_bytes={s.agent_metadata_max_bytes}")
        current = self.directory.record_bytes.get(name, 0) if agent is not None else 0
        topics = sum(topic_cost(t, t in agent.durable) for t in agent.topics) if agent is not None else 0
        total = (self.directory.estimated_bytes() - current + topics
                 + self.directory.record_cost(name, caps, meta, contracts))
        if total > s.directory_max_bytes:
            return (f"this node's directory would take {total} bytes; the limit is "
                    f"directory_max_bytes={s.directory_max_bytes}")
        return None

    @staticmethod
    def pattern_malformed(topic: str) -> str | None:
        """Why a wildcard pattern is malformed (VALIDATION_FAILED: ``>`` not last, an empty
        token), or None; its length is a bound, checked by ``subscription_refused``."""
        if not T.is_pattern(topic):
            return None
        return T.pattern_problem(topic, max_tokens=1 << 30)

    def subscription_refused(self, agent: LocalAgent, topic: str, durable: bool) -> str | None:
        """Why this subscription would pass a directory bound (TOO_LARGE), or None."""
        s = self.settings
        if topic not in agent.topics and T.is_pattern(topic):
            long = T.pattern_problem(topic, s.max_pattern_tokens)
            if long is not None:
                return long
            patterns = sum(1 for t in agent.topics if T.is_pattern(t))
            if patterns >= s.max_patterns_per_agent:
                return (f"{agent.name!r} subscribes to {patterns} wildcard patterns; the limit is "
                        f"max_patterns_per_agent={s.max_patterns_per_agent}")
        if topic in agent.topics:
            grow = topic_cost(topic, durable) - topic_cost(topic, topic in agent.durable)
        elif len(agent.topics) >= s.max_subscriptions_per_agent:
            return (f"{agent.name!r} subscribes to {len(agent.topics)} topics; the limit is "
                    f"max_subscriptions_per_agent={s.max_subscriptions_per_agent}")
        else:
            grow = topic_cost(topic, durable)
        total = self.directory.estimated_bytes() + grow
        if grow > 0 and total > s.directory_max_bytes:
            return (f"this node's directory would take {total} bytes; the limit is "
                    f"directory_max_bytes={s.directory_max_bytes}")
        return None

    def contracts_of(self, name: str | None) -> list[dict[str, Any]] | None:
        """The contract records agent ``name`` advertises ([] if untyped), None if unknown."""
        if name is None:
            return None
        name = name.partition("@")[0]
        local = self.directory.local.get(name)
        if local is not None:
            return local.contracts
        host = self.directory.host_of(name)
        if host is None:
            return None
        contracts = self.directory.records_of(host).get(name, {}).get("contracts")
        return contracts if isinstance(contracts, list) else []

    def alive(self, agent: LocalAgent) -> bool:
        """Probe with a PING: ROUTER_MANDATORY says at once whether the connection still exists."""
        try:
            self.link.sock.send_multipart([agent.rid, *P.frames({P.KIND: Kind.PING})],
                                            zmq.NOBLOCK)
            return True
        except zmq.Again:
            return True  # connected but busy
        except zmq.ZMQError:
            return False

    def rid_alive(self, rid: bytes) -> bool:
        agent = self.directory.local_by_rid.get(rid)
        return agent is not None and self.alive(agent)

    def remove(self, agent: LocalAgent, why: str) -> None:
        dropped = self.directory.remove_local(agent)
        if dropped is None:
            return
        self.link.forget(agent.rid)
        self.peer_table.subscribe_all(dropped, zmq.UNSUBSCRIBE)
        log.info("agent %r removed: %s", agent.name, why)
        self.agent_event(agent, str(agent.state), "absent")
        self.directory_changed()

    def evict(self, agent: LocalAgent, why: str) -> None:
        err = P.error_header(agent.name, None, P.ErrorCode.NAME_TAKEN, why, sender=f"meshd@{self.node_id}")
        self.link.send(agent.rid, err)
        self.remove(agent, why)

    def on_monitor(self, frames: list[bytes]) -> None:
        # An agent connection closed; find out which by probing (MANDATORY reports the dead one).
        # libzmq may still be tearing the pipe down, so probe again a moment later.
        loop = asyncio.get_running_loop()
        self.probe()
        loop.call_later(0.05, self.probe)
        loop.call_later(0.5, self.probe)

    def probe(self) -> None:
        if self.stopping:
            return
        for agent in list(self.directory.local.values()):
            if not self.alive(agent):
                self.remove(agent, "disconnected")
        self.link.kick()

    def directory_changed(self, agent: LocalAgent | None = None) -> None:
        """Bump the directory version now (``agent``: its state changed); peers hear of it once
        per loop turn, however many changes, as a delta of what changed (meshd/mesh/directory_updates.py)."""
        self.directory.bump()
        if agent is not None:
            self.directory.journal.fields(agent.name)
        if not self.stopping:
            self.updates.changed()

    def subscribe(self, agent: LocalAgent, topic: str, durable: bool = False) -> None:
        changed, key = self.directory.subscribe(agent, topic, durable)
        if key is not None:
            self.peer_table.subscribe_all([key], zmq.SUBSCRIBE)
        if changed:
            self.directory_changed()

    def unsubscribe(self, agent: LocalAgent, topic: str) -> None:
        changed, key = self.directory.unsubscribe(agent, topic)
        if key is not None:
            self.peer_table.subscribe_all([key], zmq.UNSUBSCRIBE)
        if changed:
            self.directory_changed()

    def agent_event(self, agent: LocalAgent, old: str, new: str) -> None:
        self.plugins.agent_state({"name": agent.name, "node": self.node_id,
                                  "capabilities": list(agent.capabilities)}, old, new)

    def telemetry(self) -> dict[str, Any]:
        return {a.name: {"state": str(a.state), "telemetry": a.telemetry}
                for a in self.directory.local.values()}

    def check_liveness(self, now: float) -> None:
        """Silent agents go stale, then are removed (``now``: monotonic seconds)."""
        s = self.settings
        for agent in list(self.directory.local.values()):
            age = now - agent.last_seen
            state = next_state(agent.state, age, s.stale_after, s.offline_after)
            if state is PeerState.OFFLINE:
                self.remove(agent, f"no heartbeat for {age:.1f} s")
            elif state is PeerState.STALE:
                self.agent_event(agent, str(agent.state), "stale")
                agent.state = PeerState.STALE
                self.directory_changed(agent)
