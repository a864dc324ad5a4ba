"""Routing: the edge checks, and where each message goes (deliver, forward, bounce, publish).

Owns: the mesh ROUTER's and the local socket's data path. A frame set is decoded once into a
:class:`~meshd.wire.protocol.Header` (``on_mesh``, ``on_agent``); the edge checks of docs/PROTOCOL.md
§8.5 run in ``on_agent``; ``route`` resolves ``name[@node]`` to a local agent (``deliver_local``)
or a peer (its DEALER); what cannot go anywhere is ``bounce``-d to its sender as one error
envelope; ``publish`` fans a publication out and ``on_topic`` hands a peer's publication to local
subscribers, both through the ``Publications`` it composes (meshd/delivery/publications.py, with the gap
notices and the INBOX_FULL notice to publishers); malformed input is ``reject``-ed
(counted, dead-lettered). Forwarding sends the raw frames it received: nothing is re-encoded.
It must not own peer state (peers.py), agent records (directory.py) or the outbox (qos1.py):
it asks them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import zmq

from meshd import transport
from meshd.delivery.content_routes import ROUTE_PREFIX, ContentRoutes, readdressed
from meshd.delivery.dead_letters import DeadLetters
from meshd.delivery.local_agents import AgentLink, LocalAgents
from meshd.delivery.open_requests import OpenRequests
from meshd.delivery.outcomes import Outcomes
from meshd.delivery.publications import OUTBOX_RETRY_AFTER, Publications, PublishRouting
from meshd.delivery.traffic import TrafficTally
from meshd.mesh.directory import Directory, LocalAgent
from meshd.mesh.liveness import PeerState
from meshd.mesh.peers import PeerTable
from meshd.mesh.security import Security
from meshd.plugins.host import PluginHost
from meshd.plugins.policy import Authorizer
from meshd.util.logonce import LogOnce
from meshd.util.priority import priority_of
from meshd.util.shutdown import Shutdown
from meshd.wire import protocol as P
from meshd.wire import topics as T
from meshd.wire.protocol import FrameError, Kind
from meshd.wire.system_names import system_agent_name

if TYPE_CHECKING:
    from meshd.config.settings import Settings  # pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.delivery.qos1_driver import Qos1Driver

__all__ = ["AGENT_DATA_KINDS", "Router"]

log = logging.getLogger("meshd.node")

AGENT_DATA_KINDS = P.ROUTED_KINDS | {Kind.PUBLISH, Kind.BATCH}
REFUSAL_CODES = frozenset({P.ErrorCode.VALIDATION_FAILED, P.ErrorCode.SCHEMA_VERSION})
"""What a typed topic's contract answers when it refuses a message before its handler ran."""
SEND_FAILURE_REASONS = {P.ErrorCode.HANDLER_ERROR: P.ErrorCode.HANDLER_ERROR,
                        P.ErrorCode.VALIDATION_FAILED: "validation", P.ErrorCode.SCHEMA_VERSION: "validation",
                        P.ErrorCode.NACK: "nack"}
"""An agent's report that no handler completed a send, by code: the dead letter's reason."""
_ANSWER_KINDS = frozenset({Kind.REPLY, Kind.ERROR, Kind.PROGRESS})
_CHECKED_KINDS = _ANSWER_KINDS | {Kind.REQUEST}
_REQUEST_KIND = frozenset({Kind.REQUEST})


def _declares(header: P.Header, kinds: frozenset[str]) -> bool:
    """Does a batch header's ``kinds`` declare one of ``kinds``? Only such a batch body is decoded
    at the edge (receiving clients drop undeclared answers, docs/PROTOCOL.md §4.2), so a batch of
    sends costs nothing more (decoding every body cost ~0.8 us per message)."""
    declared = header.get(P.KINDS)
    return isinstance(declared, list) and any(isinstance(k, str) and k in kinds for k in declared)
def _declare_kinds(header: P.Header, frames: list[bytes]) -> tuple[P.Header, list[bytes]]:
    """A batch in the previous revision's form (no ``kinds``, docs/PROTOCOL.md §4.2 and the
    version policy, §4.4): its body decoded here, as every batch body was then, and its header
    completed with the kinds it holds, so the checks below and the receiving client treat it as
    a current batch. Only such batches pay the decoding. Raises FrameError (an undecodable body)."""
    inner = P.split_batch(frames[1:])
    fields = dict(header.fields)
    fields[P.KINDS] = sorted({str(h[P.KIND]) for h, _ in inner})
    packed = P.pack(fields)
    if len(packed) > P.MAX_HEADER_BYTES:
        raise FrameError("bad_field", f"the batch header with 'kinds' would pass {P.MAX_HEADER_BYTES} bytes")
    return P.header_from_map(fields), [frames[0], frames[1], packed, frames[3]]


def _split_checking_requests(frames: list[bytes]) -> list[tuple[dict[str, Any], bytes]]:
    """Split a batch that declares requests, holding each request inside it to the header ranges
    of a single request (``hops``, ``qos``, ``budget``...). Raises FrameError. Only batches
    declaring requests are decoded for this (a batch of sends costs nothing more)."""
    inner = P.split_batch(frames[1:])
    for fields, _ in inner:
        if fields.get(P.KIND) == Kind.REQUEST:
            P.header_from_map(fields)
    return inner


_AGENT_DATA_KINDS = AGENT_DATA_KINDS
_AUTHORIZED_KINDS = frozenset({Kind.SEND, Kind.REQUEST, Kind.PUBLISH})
_LANE_KINDS = frozenset({Kind.ERROR, Kind.REPLY})
"""Routed kinds that answer a call: delivered through the agent link's answer lane."""


def _id_of(frames: list[bytes]) -> Any:
    """The ``id`` of a refused frame set whose header still decodes (a wrong frame count), so the
    sender's call is answered instead of timing out; None if there is none."""
    if len(frames) < 3 or frames[1][:3] != P.SIGNATURE[:3]:  # another version's too: it is told why
        return None
    try:
        return P.unpack_header(frames[2]).get(P.ID)
    except (FrameError, TypeError):
        return None


class Router:
    """Moves messages between local agents and peers. Built by node.py once sockets exist."""

    def __init__(self, settings: Settings, *, node_id: str, name: str, directory: Directory,
                 peer_table: PeerTable, security: Security, agents: LocalAgents, link: AgentLink,
                 xpub: zmq.Socket[Any], reactor: transport.Reactor, outcomes: Outcomes,
                 dead_letters: DeadLetters, plugins: PluginHost, stats: Counter[str], quiet: LogOnce,
                 qos: Qos1Driver, shutdown: Shutdown) -> None:
        self.settings = settings
        self.node_id = node_id
        self.name = name
        self.directory = directory
        self.peer_table = peer_table
        self.peers = peer_table.peers
        self.security = security
        self.agents = agents
        self.link = link
        self.xpub = xpub
        self.reactor = reactor
        self.outcomes = outcomes
        self.dead_letters = dead_letters
        self.plugins = plugins
        self.stats = stats
        self.quiet = quiet
        self.qos = qos
        self.after_flush = qos.after_flush
        self.shutdown = shutdown
        # meshd_authorize on agents' own send/request/publish: None (no cost) unless a plugin has it
        self.authorizer = Authorizer(plugins.authorize) if plugins.wants_authorize() else None
        # meshd_route on ``route:`` addresses: None (no cost, no such addresses) unless a plugin has it
        self.content_routes = ContentRoutes(plugins, stats, memory=settings.route_memory,
                                            max_payload_bytes=settings.max_payload_bytes) \
            if plugins.wants_route() else None
        self._system_agent = system_agent_name(node_id)
        #: Requests handed to local agents and not answered yet: answers are checked against it.
        self.open_requests = OpenRequests(settings.max_open_requests, stats)
        #: What local agents sent, by kind and (bounded) topic: metrics_topic_labels caps the topics.
        self.traffic = TrafficTally(settings.metrics_topic_labels)
        #: The publish path: fan-out, a peer's publications, gap notices, INBOX_FULL to publishers.
        self.publications = Publications(
            settings, node_id=node_id, directory=directory, link=link, qos=qos, xpub=xpub, reactor=reactor,
            stats=stats, routing=PublishRouting(route=self.route, refuse=self.refuse))

    @property
    def stopping(self) -> bool:
        """The node's shutdown has begun: only qos-1 units (stored, they survive) are taken."""
        return self.shutdown.begun

    def on_mesh_checked(self, frames: list[Any]) -> None:
        """Keys mode: the ZAP User-Id (the authenticated key) must be the key the sender claims."""
        try:
            uid = frames[1].get("User-Id")
        except zmq.ZMQError:
            uid = ""
        raw = [f.bytes for f in frames]
        peer = self.peer_table.for_rid(raw[0])
        verdict = self.security.admit(uid, peer.pubkey if peer is not None and peer.greeted else None)
        if verdict is not None:
            self.stats[verdict] += 1
            if peer is not None and verdict == "dropped_spoofed":
                self.quiet.log(f"spoof:{peer.node_id}:{uid}", "dropped traffic claiming to be node %s "
                               "from key %s (its key is %s)", peer.node_id, uid, peer.pubkey)
            return
        self.on_mesh(raw, uid)

    def on_mesh(self, frames: list[bytes], key: str = "") -> None:
        """Everything peers send us: control, routed messages and batches. ``key``: keys mode's
        authenticated key of the sender (on_mesh_checked), which a HELLO must claim."""
        rid = frames[0]
        try:
            header = P.decode_routed_header(frames)
        except FrameError as exc:
            self.reject(exc, frames, origin=f"peer {rid[:32]!r}", header=exc.fields)
            return
        kind = header.kind
        if len(frames) != 4:  # §4.1 holds for peers too, control kinds included
            self.reject(FrameError("batch_odd_frames" if kind == Kind.BATCH else "too_many_frames",
                                   str(len(frames) - 1)), frames, origin=f"peer {rid[:32]!r}", header=header)
            return
        peer = self.peer_table.for_rid(rid)
        if kind in P.PEER_CONTROL_KINDS:
            self.peer_table.on_control(rid, peer, header, frames, key)
            return
        if peer is None or not peer.greeted:
            self.stats["dropped_data_before_hello"] += 1  # of dropped_before_hello: not control
            self.peer_table.unknown_sender(peer or self.peer_table.claimed(rid))
            return
        self.peer_table.heard_from(peer)
        to = header.to
        if not isinstance(to, str) or kind not in _AGENT_DATA_KINDS:
            self.reject(FrameError("not_deliverable", f"{kind} without a destination"), frames,
                         origin=f"peer {peer.node_id}", header=header)
            return
        if kind == Kind.ERROR and self.qos.is_ours(header.corr):
            err = header.get(P.ERROR)
            self.qos.bounced(str(header.corr), str(err.get("code")) if isinstance(err, dict) else "ERROR")
            return
        if header.qos == 1 and self.qos.reack_if_done(str(header.id), peer.node_id):
            return  # handled already (maybe by an agent that has left since): ack, never bounce
        if kind == Kind.BATCH and not isinstance(header.get(P.KINDS), list):
            # From a daemon of the previous revision (it checked every batch body it took from its
            # agents): completed here, so the receiving client does not drop its requests unseen.
            try:
                header, frames = _declare_kinds(header, frames)
            except FrameError as exc:
                self.stats["malformed_batch"] += 1
                self.bounce(header, frames[1:], P.ErrorCode.VALIDATION_FAILED, f"malformed batch: {exc}",
                            origin=peer.node_id)
                return
            self.stats["batches_without_kinds"] += 1
        name, _, node = to.partition("@")
        agent = self.directory.local.get(name)
        if agent is None or (node and node not in (self.node_id, self.name)):
            self.bounce(header, frames[1:], P.ErrorCode.NO_SUCH_AGENT,
                         f"no agent named {to!r} on node {self.node_id}", origin=peer.node_id)
            return
        self.deliver_local(agent, header, frames[1:], peer.node_id)

    def on_agent(self, frames: list[bytes]) -> None:
        """Everything local agents send us. No input may escape as an exception (the sender would
        wait for an answer forever): what the checks did not foresee is answered with
        VALIDATION_FAILED (when its id can be read), counted (``agent_input_errors``) and logged
        once per cause."""
        try:
            self._on_agent(frames)
        except Exception as exc:  # the last guard: one bad message, never a traceback per message
            self.stats["agent_input_errors"] += 1
            self.stats[f"agent_input_errors_{type(exc).__name__}"] += 1
            tb = exc.__traceback__
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            where = f"{tb.tb_frame.f_code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno}" if tb else "?"
            self.quiet.log(f"agent_input:{type(exc).__name__}:{where}", "refused a message from a local "
                           "agent that failed with %s at %s (logged once per cause)",
                           type(exc).__name__, where)
            msg_id: Any = None
            with contextlib.suppress(Exception):
                msg_id = P.unpack_header(frames[2]).get(P.ID)
            self.link.send_error(frames[0], msg_id if isinstance(msg_id, str) else None,
                                 P.ErrorCode.VALIDATION_FAILED, f"malformed message ({type(exc).__name__})")

    def _on_agent(self, frames: list[bytes]) -> None:
        rid = frames[0]
        try:
            header = P.decode_routed_header(frames)
        except FrameError as exc:
            # A header that decoded but has a field out of range names its id, so the sender's
            # request fails at once instead of timing out.
            self.reject(exc, frames, origin="local agent", header=exc.fields)
            corr = exc.fields.get(P.ID) if exc.fields else _id_of(frames)
            self.link.send_error(rid, corr, P.ErrorCode.VALIDATION_FAILED, f"malformed message: {exc}")
            return
        kind = header.kind
        agent = self.directory.local_by_rid.get(rid)
        if agent is not None:
            agent.last_seen = time.monotonic()
        if kind in P.AGENT_CONTROL_KINDS:
            if len(frames) != 4:  # §4.1 holds for control too (a 10,000-frame register was accepted)
                self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                            f"a {kind} message has exactly 3 frames, not {len(frames) - 1}")
                return
            self.agents.on_control(rid, agent, kind, header, frames)
            return
        if kind not in _AGENT_DATA_KINDS:
            # hello, hb, dir, ok, ... are daemon business: an agent must not forge them.
            self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                         f"agents may not send {kind!r} messages")
            return
        if agent is None:
            self.refuse(rid, header, frames, P.ErrorCode.NOT_REGISTERED, "register a name before sending")
            return
        if self.stopping and header.qos != 1:  # a qos-1 unit is stored and survives the restart
            # Peers heard our BYE and drop what we would forward now: refuse, so the client holds
            # the message and sends it again once registered with the next daemon.
            self.refuse(rid, header, frames, P.ErrorCode.NOT_REGISTERED,
                        "the daemon is stopping; register again with the next one")
            return
        if header.sender != agent.name:
            self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                         f"'from' must be your registered name {agent.name!r}")
            return
        if self.authorizer is not None and kind != Kind.REPLY and self.forbidden(rid, header, frames):
            return
        if len(frames) != 4:
            self.link.send_error(rid, header.id, P.ErrorCode.VALIDATION_FAILED,
                                   f"a {kind} message has exactly 3 frames")
            return
        limit = self.settings.max_payload_bytes + (P.BATCH_OVERHEAD if kind == Kind.BATCH else 0)
        if len(frames[3]) > limit:
            self.refuse(rid, header, frames, P.ErrorCode.TOO_LARGE,
                         f"{kind} of {len(frames[3])} bytes exceeds max_payload_bytes="
                         f"{self.settings.max_payload_bytes}")
            return
        if kind == Kind.BATCH and not isinstance(header.get(P.KINDS), list):
            try:  # served, never dropped: the previous revision's batch (protocol version policy)
                header, frames = _declare_kinds(header, frames)
            except FrameError as exc:
                self.stats["malformed_batch"] += 1
                self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED, f"malformed batch: {exc}")
                return
            self.stats["batches_without_kinds"] += 1
        topic = header.topic
        if kind == Kind.BATCH:
            kinds, count = header.get(P.KINDS), header.get(P.COUNT)
            self.traffic.count_batch(kinds if isinstance(kinds, list) else (),
                                     count if type(count) is int and count > 0 else 1, topic)
        else:
            self.traffic.count(kind, topic)
        if kind == Kind.PUBLISH or (kind == Kind.BATCH and header.to is None):
            if not P.valid_topic(topic) or T.is_pattern(str(topic)):
                self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                             "publish needs a valid topic (a wildcard token is for subscriptions)")
                return
            self.publish(agent, str(topic), header, frames[1:])
            return
        to = header.to
        if not isinstance(to, str):
            self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED, f"{kind} needs a 'to'")
            return
        if self.content_routes is not None and to.startswith(ROUTE_PREFIX):
            self._route_by_content(rid, header, frames)
            return
        if kind == Kind.ERROR:
            err = header.get(P.ERROR)
            code = err.get("code") if isinstance(err, dict) else None
            if not self.open_requests.is_open(agent.name, header.corr):
                if code in SEND_FAILURE_REASONS:
                    self._send_handler_failed(agent.name, header, frames)
                    return
            elif code in REFUSAL_CODES:  # a typed request refused: kept, then answered as usual
                self.stats["refused_by_contract"] += 1
                self.dead_letter(SEND_FAILURE_REASONS[str(code)], f"request {header.corr!r} to "
                                 f"{agent.name!r} refused: {P.safe_repr(err.get('message'), 200)}",
                                 frames[1:], header)
        inner: list[tuple[dict[str, Any], bytes]] | None = None  # split once, if at all
        if kind == Kind.BATCH and _declares(header, _REQUEST_KIND):
            try:
                inner = _split_checking_requests(frames)
            except FrameError as exc:  # the ranges a single request is held to, batch or not
                self.stats["malformed_bad_field"] += 1
                self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED, f"malformed batch: {exc}")
                return
        foreign = header.origin is not None and header.origin.partition("@")[0] != agent.name
        if kind == Kind.BATCH and (foreign or _declares(header, _CHECKED_KINDS)):
            checked = self._drop_unanswerable(rid, agent.name, to, header, frames, inner)
            if checked is None:
                return
            header, frames = checked
        elif kind in _ANSWER_KINDS or foreign:
            why = self._check_answer(agent.name, kind, header.corr, header.origin, to)
            if why is not None:
                self.stats["refused_forged_answer"] += 1
                self.dead_letter("forged_answer", f"from local agent {agent.name!r}: {why}", frames[1:],
                                 header)
                self.quiet.log(f"forged:{agent.name}", "refused an answer from agent %s: %s",
                               agent.name, why)
                self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED, why)
                return
        if header.qos == 1:
            unit_id = header.id
            if kind not in (Kind.SEND, Kind.BATCH) or not isinstance(unit_id, str):
                self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                             "qos 1 applies to send (single or batched) with a string id")
                return
            full = self.qos.refusal(unit_id, to, frames[1:])
            if full is not None:
                self.refuse(rid, header, frames, P.ErrorCode.OUTBOX_FULL, full,
                            retry_after=OUTBOX_RETRY_AFTER)
                return
            self.qos.accept(rid, agent.name, unit_id, to, frames[1:], header)
            return
        if kind == Kind.REQUEST:
            hops = header.hops
            if hops > self.settings.hop_limit:
                self.bounce(header, frames[1:], P.ErrorCode.HOP_LIMIT,
                             f"forwarded {hops} times; the hop limit is {self.settings.hop_limit}")
                return
            deadline = header.deadline
            if deadline is not None and deadline <= time.monotonic():  # budget 0: nothing left
                self.bounce(header, frames[1:], P.ErrorCode.TIMEOUT,
                             "the request's deadline passed before it was delivered")
                return
        sends = self.outcomes.outgoing(header, frames[1:])
        self.outcomes.sends_routed(sends, self.route(to, header, frames[1:]))

    def _route_by_content(self, rid: bytes, header: P.Header, frames: list[bytes]) -> None:
        """A message to a ``route:`` address: a plugin chooses the agent (``meshd_route``,
        meshd/delivery/content_routes.py); the message is then handled as if sent to it."""
        routes = self.content_routes
        assert routes is not None
        kind, to = header.kind, str(header.to)
        if kind == Kind.CANCEL:  # it follows its request, wherever that was routed
            target = routes.cancel_target(header.corr)
            routes.forget(header.corr)
            if target is None:
                self.stats["route_cancel_unknown"] += 1
                return
            self.on_agent(readdressed(header, frames, target)[1])
            return
        if kind == Kind.BATCH and header.qos != 1:  # qos 0: each message is routed on its own
            try:
                pairs = P.split_batch(frames[1:])
            except FrameError as exc:
                self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED, f"malformed batch: {exc}")
                return
            for inner, payload in pairs:
                inner[P.FROM], inner[P.TO] = header.sender, to
                inner.setdefault(P.TOPIC, header.topic)
                if P.PRIO in header.fields:
                    inner[P.PRIO] = header.fields[P.PRIO]
                self.on_agent([rid, P.SIGNATURE, P.pack(inner), payload])
            return
        if kind not in (Kind.SEND, Kind.REQUEST, Kind.BATCH):
            self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED,
                        f"a {kind} cannot go to a {ROUTE_PREFIX} address")
            return
        chosen = routes.choose(header, frames[3])
        name = (chosen or "").partition("@")[0]
        if chosen is None or (name not in self.directory.local and self.directory.host_of(name) is None):
            why = "no plugin chose an agent" if chosen is None else f"it chose {chosen!r}, not in the mesh"
            self.bounce(header, frames[1:], P.ErrorCode.NO_SUCH_AGENT, f"route {to!r}: {why}")
            return
        self.on_agent(readdressed(header, frames, chosen)[1])

    def forbidden(self, rid: bytes, header: P.Header, frames: list[bytes]) -> bool:
        """Ask ``meshd_authorize`` (cached) about an agent's own send, request or publish, each
        message of a batch included; refuse the whole frame set with FORBIDDEN when any is refused.
        The system agent is not asked about: its tools asked about their caller already."""
        assert self.authorizer is not None
        sender = str(header.sender)
        if sender == self._system_agent:
            return False
        if header.kind == Kind.BATCH:
            try:
                inner = [(h.get(P.KIND), h.get(P.TOPIC, header.topic)) for h, _ in P.split_batch(frames[1:])]
            except FrameError:
                inner = [(Kind.SEND, "?")]  # a batch that cannot be read cannot be authorized
        else:
            inner = [(header.kind, header.topic)]
        target = header.to if isinstance(header.to, str) else "*"
        for kind, topic in dict.fromkeys(inner):
            if kind not in _AUTHORIZED_KINDS:
                continue
            where = "*" if kind == Kind.PUBLISH else target
            reason = self.authorizer.check("message", sender, where, None if topic is None else str(topic))
            if reason is None:
                continue
            what = f"publish on {topic!r}" if where == "*" else f"message {where!r} on {topic!r}"
            self.refuse(rid, header, frames, P.ErrorCode.FORBIDDEN,
                        f"agent {sender!r} may not {what}: {reason}")
            self.plugins.tool_event({"event": "forbidden", "action": "message", "tool": None,
                                     "caller": sender, "target": where, "topic": topic, "node": self.node_id,
                                     "at": time.time(), "reason": reason})
            return True
        return False
    def _drop_unanswerable(self, rid: bytes, responder: str, to: str, header: P.Header, frames: list[bytes],
                           inner: list[tuple[dict[str, Any], bytes]] | None,
                           ) -> tuple[P.Header, list[bytes]] | None:
        """A batch's replies, errors, progress notes and delegations, checked one by one as single
        ones are (each must answer a request this daemon delivered to ``responder`` from ``to``, else
        any agent could forge answers). An item that may not go, most often a reply that came after
        its request expired, is refused alone with its own error and dead letter; the rest of the
        batch goes on (refusing the whole batch once cost an unrelated request batched beside a late
        reply). Returns the batch to route, rebuilt when items were taken out; None: nothing is left.
        ``inner``: the batch already split by the caller."""
        if inner is None:
            try:
                inner = P.split_batch(frames[1:])
            except FrameError as exc:
                self.stats["malformed_batch"] += 1
                self.refuse(rid, header, frames, P.ErrorCode.VALIDATION_FAILED, f"malformed batch: {exc}")
                return None
        kept: list[tuple[dict[str, Any], bytes]] = []
        for fields, payload in inner:
            kind, origin, corr = fields.get(P.KIND), fields.get(P.ORIGIN), fields.get(P.CORR)
            origin = origin if isinstance(origin, str) else None
            why = None
            if kind in _ANSWER_KINDS or (origin is not None and origin.partition("@")[0] != responder):
                why = self._check_answer(responder, str(kind), corr if isinstance(corr, str) else None,
                                         origin, to)
            if why is None:
                kept.append((fields, payload))
                continue
            self.stats["refused_forged_answer"] += 1
            self.stats["refused_validation_failed"] += 1
            self.dead_letter("forged_answer", f"from local agent {responder!r} (in a batch): {why}",
                             [frames[1], P.pack(fields), payload], fields)
            self.quiet.log(f"forged:{responder}", "refused an answer from agent %s: %s", responder, why)
            self.link.send_error(rid, fields.get(P.ID), P.ErrorCode.VALIDATION_FAILED, why)
        if not kept:
            return None
        if len(kept) == len(inner):
            return header, frames
        fields = dict(header.fields)
        fields[P.COUNT] = len(kept)
        fields[P.KINDS] = sorted({str(h[P.KIND]) for h, _ in kept})
        return P.header_from_map(fields), [frames[0], frames[1], P.pack(fields), P.pack_batch(kept)]

    def _send_handler_failed(self, agent: str, header: P.Header, frames: list[bytes]) -> None:
        """An agent reports that its handler for a ``send`` raised, or that the send was refused
        (by the topic's contract, or by the handler with a NACK): a dead letter (``HANDLER_ERROR``,
        ``validation`` or ``nack``) and a ``send`` outcome with that error for observer plugins.
        A handler's failure is not routed (a send is not answered); a refusal goes on to a qos-0
        sender as a notice, with its hints (retry, retry_after, fallback, the field)."""
        err = header.get(P.ERROR)
        assert isinstance(err, dict)
        code = str(err.get("code"))
        text = P.safe_repr(err.get("message"), 200)
        self.stats["send_handler_errors" if code == P.ErrorCode.HANDLER_ERROR else "refused_by_contract"
                   if code in REFUSAL_CODES else "sends_nacked"] += 1
        verb = "raised" if code == P.ErrorCode.HANDLER_ERROR else f"refused it ({code})"
        self.dead_letter(SEND_FAILURE_REASONS[code], f"handler of {agent!r} for send {header.corr!r} from "
                         f"{header.to!r} {verb}: {text}", frames[1:], header)
        self.outcomes.emit("send", header.corr, header.to, agent, header.topic, "error", code)
        if code == P.ErrorCode.HANDLER_ERROR or header.qos == 1 or not isinstance(header.to, str):
            return  # a qos-1 unit's sender hears of it from the outbox (docs/DELIVERY.md)
        after = err.get("retry_after")
        retry_after = float(after) if isinstance(after, (int, float)) and not isinstance(after, bool) \
            and 0 <= after <= 86_400 else None
        notice = P.error_header(header.to, header.corr, code, str(err.get("message", code))[:500],
                                retry=err.get("retry") is True, retry_after=retry_after,
                                sender=agent, notice=True)
        fallback = err.get("fallback")
        if isinstance(fallback, str) and P.valid_topic(fallback):
            notice[P.ERROR]["fallback"] = fallback
        for key in P.ERROR_DETAIL_KEYS:
            if key in err:
                notice[P.ERROR][key] = err[key]
        if len(P.pack(notice)) <= P.MAX_HEADER_BYTES // 2:
            self.route(header.to, P.header_from_map(notice), P.frames(notice))

    def _check_answer(self, responder: str, kind: str, corr: str | None, origin: str | None,
                      to: str) -> str | None:
        if kind == Kind.REQUEST:  # a delegation: keeps the requester of the request it forwards
            if origin is None or origin.partition("@")[0] == responder:
                return None
            return self.open_requests.check(responder, corr, origin, closes=False)
        return self.open_requests.check(responder, corr, to, closes=kind in (Kind.REPLY, Kind.ERROR))

    def _record_requests(self, agent: LocalAgent, header: P.Header, msg: list[bytes]) -> None:
        """Remember the requests handed to ``agent``, so its answers can be checked."""
        if header.kind == Kind.REQUEST:
            requester = header.reply_to
            corr = header.corr or header.id
            if requester is not None and corr is not None:
                self.open_requests.opened(agent.name, corr, requester, header.deadline)
            return
        try:
            inner = P.split_batch(msg)
        except FrameError:
            return  # the client refuses it too
        for fields, _ in inner:
            if fields.get(P.KIND) != Kind.REQUEST:
                continue
            requester = fields.get(P.ORIGIN) or header.sender
            corr = fields.get(P.CORR) or fields.get(P.ID)
            try:  # this host's monotonic deadline from the budget (hosts' clocks differ)
                deadline = P.local_deadline(fields)
            except FrameError:
                deadline = None
            if isinstance(requester, str) and isinstance(corr, str):
                self.open_requests.opened(agent.name, corr, requester, deadline)

    def refuse(self, rid: bytes, header: P.Header, frames: list[bytes], code: str,
                message: str, *, retry_after: float | None = None) -> None:
        """Refuse an agent's message at the edge: one error per message, batches included."""
        self.stats[f"refused_{code.lower()}"] += 1
        ids: list[Any] = [header.id]
        if header.kind == Kind.BATCH:
            with contextlib.suppress(FrameError):
                ids = [h.get(P.ID) for h, _ in P.split_batch(frames[1:])]
        for msg_id in ids:
            self.link.send_error(rid, msg_id, code, message, retry_after=retry_after)

    def route(self, to: str, header: P.Header, msg: list[bytes]) -> str | None:
        """Deliver ``msg`` (signature, header, payload frames) to agent ``to`` wherever it is.

        Returns None when it went on its way, else the error code it bounced with.
        """
        name, _, node = to.partition("@")
        agent = self.directory.local.get(name)
        if agent is not None and (not node or node in (self.node_id, self.name)):
            return self.deliver_local(agent, header, msg, self.node_id)
        host = self.directory.host_of(name)
        peer = self.peers.get(host) if host is not None else None
        if peer is None or (node and node not in (peer.node_id, peer.name)):
            return self.bounce(header, msg, P.ErrorCode.NO_SUCH_AGENT, f"no agent named {to!r} in the mesh")
        if peer.state is PeerState.OFFLINE or peer.dealer is None:
            return self.bounce(header, msg, P.ErrorCode.PEER_UNREACHABLE,
                                f"node {peer.node_id} hosting {name!r} is offline", retry=True)
        if peer.state is PeerState.ONE_WAY:  # we hear it, it does not confirm hearing us: fail fast
            return self.bounce(header, msg, P.ErrorCode.PEER_UNREACHABLE,
                                f"node {peer.node_id} hosting {name!r} is one-way: it has not confirmed "
                                "hearing this node recently", retry=True)
        try:
            transport.send_frames(peer.dealer, msg)
        except zmq.ZMQError:
            return self.bounce(header, msg, P.ErrorCode.PEER_UNREACHABLE,
                                f"node {peer.node_id} is not accepting messages", retry=True)
        self.stats["forwarded"] += 1
        return None

    def deliver_local(self, agent: LocalAgent, header: P.Header, msg: list[bytes],
                       origin: str) -> str | None:
        unit_id = header.id if header.qos == 1 else None
        if unit_id is not None and not self.qos.admit(str(unit_id), origin, agent.rid, self.agents.rid_alive):
            return None  # a duplicate: already handled or in the agent's hands
        if self.outcomes.inflight:
            self.outcomes.answer(agent.name, header, msg)
        if header.kind == Kind.REQUEST or (header.kind == Kind.BATCH and header.to is not None
                                           and _declares(header, _REQUEST_KIND)):
            self._record_requests(agent, header, msg)
        code: str | None = None
        if header.kind in _LANE_KINDS:  # the answer lane: never silenced by the data inbox cap
            if self.link.send_answer([agent.rid, *msg], header.kind == Kind.REPLY, P.is_notice(header)):
                self.stats["delivered"] += 1
                return None
            return self.bounce(header, msg, P.ErrorCode.INBOX_FULL,
                               f"{self.link.backlog_max} answers wait for {agent.name!r} already",
                               origin=origin)
        if self.link.in_credit_mode(agent.rid):  # the inbox waits in the daemon, by priority
            count = P.credit_count(header.kind, header.get(P.KINDS), header.get(P.COUNT))
            try:
                taken = self.link.send_data([agent.rid, *msg], priority_of(header.fields.get(P.PRIO)), count)
            except zmq.ZMQError:  # the connection is gone (ROUTER_MANDATORY)
                return self._connection_gone(agent, header, msg, unit_id, origin)
            if taken:
                agent.work_sent += count
                self.stats["delivered"] += 1
                return None
            if unit_id is not None:
                self.qos.not_delivered(str(unit_id))
            return self.bounce(header, msg, P.ErrorCode.INBOX_FULL, f"inbox of {agent.name!r} is full",
                               retry=True, retry_after=0.1, origin=origin)
        try:
            if self.link.has_backlog(agent.rid):
                raise zmq.Again  # answers wait for this agent: they go first
            self.link.send_now([agent.rid, *msg])
            if header.kind == Kind.BATCH:  # counted as messages, as the agent counts what it reads
                count = header.get(P.COUNT)
                agent.work_sent += count if type(count) is int and count > 0 else 1
            else:
                agent.work_sent += 1
            self.stats["delivered"] += 1
        except zmq.Again:
            prio = header.fields.get(P.PRIO)
            if unit_id is None and prio is not None and prio < P.DEFAULT_PRIORITY and \
                    self.link.hold_urgent([agent.rid, *msg], prio):
                self.stats["delivered"] += 1  # it waits ahead of the backlog (priority_hold_max)
                return None
            if unit_id is not None:
                self.qos.not_delivered(str(unit_id))
            code = self.bounce(header, msg, P.ErrorCode.INBOX_FULL, f"inbox of {agent.name!r} is full",
                                retry=True, retry_after=0.1, origin=origin)
        except zmq.ZMQError:
            code = self._connection_gone(agent, header, msg, unit_id, origin)
        self.link.kick()
        return code

    def _connection_gone(self, agent: LocalAgent, header: P.Header, msg: list[bytes],
                         unit_id: Any, origin: str | None) -> str:
        """The agent's connection is gone (a send raised ZMQError): forget the agent, put a
        qos-1 unit back for a retry, and bounce NO_SUCH_AGENT."""
        if unit_id is not None:
            self.qos.not_delivered(str(unit_id))
        self.agents.remove(agent, "connection gone")
        return self.bounce(header, msg, P.ErrorCode.NO_SUCH_AGENT, f"agent {agent.name!r} disconnected",
                           origin=origin)

    def bounce(self, header: P.Header, msg: list[bytes], code: str, message: str, *,
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
        self.dead_letter(code, message, msg, header)
        sender = header.origin or header.sender
        if not isinstance(sender, str):
            return code
        if header.kind == Kind.BATCH:
            inner: list[tuple[Any, Any]] = []
            with contextlib.suppress(FrameError):
                inner = P.split_batch(msg)
            ids = [h.get(P.CORR) or h.get(P.ID) for h, _ in inner
                   if h.get(P.KIND) in (Kind.SEND, Kind.REQUEST)]
            notice = not any(h.get(P.KIND) == Kind.REQUEST for h, _ in inner)
        elif header.kind in (Kind.SEND, Kind.REQUEST):
            ids = [header.corr or header.id]
            notice = header.kind == Kind.SEND  # a qos-0 send: its client awaits nothing
        else:
            return code  # replies and errors never bounce: no loops
        ids = [i for i in ids if isinstance(i, str)]
        if not ids:
            return code
        # One envelope for the whole batch (``ids``), so a refused batch of 64 is one message back.
        err = P.error_header(sender, ids[0] if len(ids) == 1 else None, code, message, retry=retry,
                             retry_after=retry_after, sender=f"meshd@{self.node_id}", notice=notice)
        if len(ids) > 1:
            err[P.IDS] = ids
        self.route(sender, P.header_from_map(err), P.frames(err))
        return code

    def publish(self, agent: LocalAgent, topic: str, header: P.Header, msg: list[bytes]) -> None:
        """Fan a publication out (meshd/delivery/publications.py: ``Publications.publish``)."""
        self.publications.publish(agent, topic, header, msg)

    def on_topic(self, frames: list[bytes]) -> None:
        """A publication from a peer's XPUB: hand it to the local subscribers (``Publications``)."""
        self.publications.on_topic(frames)

    def on_xpub(self, frames: list[bytes]) -> None:
        # Subscription notices from peers' SUBs; the XPUB applies them itself, we only count.
        self.stats["subscription_notices"] += 1

    def reject(self, exc: FrameError, frames: list[bytes], origin: str,
                header: P.Header | Mapping[str, Any] | None = None) -> None:
        """A malformed frame set: count it, keep it as a dead letter, log once per reason."""
        self.stats["malformed"] += 1
        self.stats[f"malformed_{exc.reason}"] += 1
        self.dead_letter(f"malformed:{exc.reason}", f"from {origin}: {exc}", frames[1:], header)
        self.quiet.log(f"malformed:{exc.reason}:{origin}", "dropped malformed message from %s: %s",
                       origin, exc)

    def dead_letter(self, reason: str, detail: str, frames: list[bytes],
                     header: P.Header | Mapping[str, Any] | None, attempts: int = 0) -> None:
        self.dead_letters.record(reason, detail, frames, header, attempts)
