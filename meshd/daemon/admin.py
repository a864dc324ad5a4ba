"""meshctl's view of a daemon: queries (agents, peers) and dead-letter operations.

Owns: the answers to ``query`` (``agents``, ``peers``; ``node`` comes from node.py, which sees
every part) and to ``admin`` calls (``deadletters.list``, ``.show``, ``.replay``, ``.purge``,
and ``.file``: an agent's own letter).
It reads the directory, the peer table and the dead letters; a replay hands the message back to
routing (qos 0) or to the qos-1 outbox. It must not change peers or agents.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshd.delivery.dead_letters import DeadLetters
from meshd.delivery.local_agents import AgentLink
from meshd.mesh.directory import Directory
from meshd.mesh.liveness import PeerState
from meshd.mesh.peers import PeerTable
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind
from meshd.wire.system_names import SYSTEM_PREFIX

if TYPE_CHECKING:
    from meshd.delivery.qos1_driver import Qos1Driver

__all__ = ["Admin", "letter_summary"]

_REPLAYABLE = frozenset({Kind.SEND, Kind.REQUEST, Kind.BATCH})
FILED_REASON = re.compile(r"[A-Z0-9_:-]{1,64}")
"""The reason of a letter an agent files (``deadletters.file``)."""
FILED_DETAIL_MAX = 1000
FILED_MAX_BYTES = P.DEFAULT_MAX_PAYLOAD_BYTES + 64 * 1024
"""The arguments of ``deadletters.file`` (a payload and its header): at most this many bytes."""


def letter_summary(letter: dict[str, Any]) -> dict[str, Any]:
    """One dead letter as ``meshctl deadletters`` lists it."""
    header = letter.get("header") or {}
    return {
        "seq": letter["seq"], "at": letter["at"], "reason": letter["reason"], "detail": letter["detail"],
        "attempts": letter.get("attempts", 0), "header": header,
        "kind": header.get(P.KIND), "from": header.get(P.FROM), "to": header.get(P.TO),
        "topic": header.get(P.TOPIC), "bytes": sum(len(f) for f in letter["frames"]),
    }


class Admin:
    """Queries and dead-letter operations for meshctl."""

    def __init__(self, *, node_id: str, name: str, directory: Directory, peer_table: PeerTable,
                 dead_letters: DeadLetters, link: AgentLink, qos: Qos1Driver,
                 route: Callable[[str, P.Header, list[bytes]], Any],
                 doctor: Callable[[], dict[str, Any]], mdns_query: Callable[[], bool]) -> None:
        """``route``: how a replayed dead letter goes out (``Router.route``, through the node: the
        router is built after this desk); ``doctor``: the doctor's report
        (meshd.daemon.doctor.daemon_report); ``mdns_query``: sends one mDNS query for meshd nodes now
        (Discovery.send_query): the doctor asks for it while it listens, so that a quiet LAN still
        shows traffic."""
        self.node_id = node_id
        self.name = name
        self.directory = directory
        self.peer_table = peer_table
        self.peers = peer_table.peers
        self.dead_letters = dead_letters
        self.link = link
        self.qos = qos
        self.route = route
        self.doctor = doctor
        self.mdns_query = mdns_query

    def handle(self, rid: bytes, msg_id: Any, header: P.Header, frames: list[bytes]) -> None:
        """meshctl's operations on this daemon (dead letters)."""
        op = header.get(P.OP)
        try:
            limit = FILED_MAX_BYTES if op == "deadletters.file" else 64 * 1024  # a letter holds a payload
            args = P.unpack_body(frames[3], limit) if frames[3] else {}
        except FrameError as exc:
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, str(exc))
            return
        if not isinstance(args, dict):
            args = {}
        result: Any
        if op == "deadletters.list":
            result = [letter_summary(d) for d in self.dead_letters.list()]
        elif op == "deadletters.show":
            seq = args.get("seq")
            letter = self.dead_letters.get(seq) if isinstance(seq, int) else None
            if letter is None:
                self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                       f"no dead letter {args.get('seq')!r}")
                return
            result = letter_summary(letter) | {"frames": letter["frames"]}
        elif op == "deadletters.replay":
            result = self.replay(args)
        elif op == "deadletters.purge":
            result = {"purged": self.dead_letters.purge()}
        elif op == "deadletters.file":
            filed = self.file_letter(rid, args)
            if isinstance(filed, str):
                self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED, filed)
                return
            result = filed
        elif op == "peers.discovered":
            result = self.discovered_list()
        elif op == "doctor":
            result = self.doctor()
            if args.get("mdns_query") is True:
                result["facts"]["mdns_query_sent"] = self.mdns_query()
        else:
            self.link.send_error(rid, msg_id, P.ErrorCode.VALIDATION_FAILED,
                                 f"unknown admin op {P.safe_repr(op)}")
            return
        self.link.send(rid, {P.KIND: Kind.OK, P.CORR: msg_id}, P.pack(result))

    def replay(self, args: dict[str, Any]) -> dict[str, Any]:
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
            if len(letter["frames"]) != 3:
                continue  # not one message (signature, header, payload): kept for inspection
            self.dead_letters.pop(letter["seq"])
            frames = P.frames(fields, letter["frames"][2])
            if header.qos == 1:
                sender = self.directory.local.get(str(header.sender))
                self.qos.accept(sender.rid if sender else b"", str(header.sender), fields[P.ID], dest,
                                frames)
            else:
                self.route(dest, header, frames)
            replayed += 1
        return {"replayed": replayed}

    def file_letter(self, rid: bytes, args: dict[str, Any]) -> dict[str, Any] | str:
        """An agent's own dead letter: a message it took and could not pass on (``meshd bridge``:
        a qos-1 send JetStream gave up redelivering). Kept as a ``send`` from that agent (the
        name it registered on this connection, never one it names), so a replay sends it again
        as that agent; bounded as every dead letter. A reason to refuse it, or ``{seq}``."""
        agent = self.directory.local_by_rid.get(rid)
        if agent is None:
            return "deadletters.file: register first (a letter is filed as the agent that files it)"
        reason, detail = args.get("reason"), args.get("detail", "")
        to, topic = args.get("to"), args.get("topic")
        payload, qos, attempts = args.get("payload", b""), args.get("qos", 0), args.get("attempts", 0)
        headers, letter_id = args.get("headers"), args.get("id")
        if not isinstance(reason, str) or FILED_REASON.fullmatch(reason) is None:
            return "deadletters.file: reason must be 1-64 of A-Z 0-9 _ : -"
        if not isinstance(detail, str) or len(detail) > FILED_DETAIL_MAX:
            return f"deadletters.file: detail must be text of at most {FILED_DETAIL_MAX} characters"
        if not isinstance(payload, bytes) or qos not in (0, 1) or type(attempts) is not int \
                or not 0 <= attempts <= 1_000_000:
            return "deadletters.file: payload (bin), qos (0 or 1) or attempts out of range"
        if not isinstance(to, str) or not P.valid_name(to.partition("@")[0]) or not P.valid_topic(topic):
            return "deadletters.file: to must be an agent name and topic a topic"
        if letter_id is None:
            letter_id = P.new_id()
        if (headers is not None and not isinstance(headers, dict)) or not isinstance(letter_id, str) \
                or not 0 < len(letter_id) <= P.MAX_ID_LEN:
            return f"deadletters.file: headers must be a map and id 1-{P.MAX_ID_LEN} characters"
        fields: dict[str, Any] = {P.KIND: Kind.SEND, P.ID: letter_id, P.FROM: agent.name, P.TO: to,
                                  P.TOPIC: topic, P.QOS: qos}
        if headers:
            fields[P.HEADERS] = headers
        try:
            P.header_from_map(fields)  # to, topic, id and headers as any send's
        except FrameError as exc:
            return f"deadletters.file: {exc}"
        frames = P.frames(fields, payload)
        letter = self.dead_letters.record(reason, detail, frames, fields, attempts)
        return {"seq": letter["seq"]}

    def agent_list(self) -> list[dict[str, Any]]:
        # System agents (meshd.sys.<node>, the daemons' tool servers) are not listed.
        agents = [a.record(self.node_id) | {"node_name": self.name} for a in self.directory.local.values()
                  if not a.name.startswith(SYSTEM_PREFIX)]
        for peer in self.peers.values():
            if peer.state is PeerState.OFFLINE:
                continue
            for name, rec in self.directory.records_of(peer.node_id).items():
                if name.startswith(SYSTEM_PREFIX):
                    continue
                live = peer.telemetry.get(name)
                extra = live if isinstance(live, dict) else {}
                agents.append(dict(rec) | extra | {"node": peer.node_id, "node_name": peer.name})
        return sorted(agents, key=lambda r: str(r.get("name")))

    def peer_list(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        clones = self.peer_table.clones
        rows = [p.info(now, len(self.directory.records_of(p.node_id))) for p in self.peers.values()]
        for row in rows:
            row["duplicate"] = clones.describe(row["node"]) or None
        return sorted(rows, key=lambda r: r["node"])

    def discovered_list(self) -> list[dict[str, Any]]:
        """Nodes discovered that are not peers (untrusted key, other mesh, other protocol)."""
        return self.peer_table.sightings.rows()
