"""What crosses between sites: one msgpack map per message, answer or announcement (docs/sites.md).

Pure. Everything from NATS is hostile input: sizes and fields are range-checked here, at the
edge, and a bad one is a :class:`ValidationFailed` the bridge counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from meshd.errors import ValidationFailed
from meshd.wire import protocol as P

__all__ = ["ANSWER_ERROR", "ANSWER_PROGRESS", "ANSWER_REPLY", "MAX_ANNOUNCED", "Crossing", "pack",
           "unpack_announcement", "unpack_answer", "unpack_crossing"]

ORIGIN_HEADER: Final = "Meshd-Site"
"""The site a message left from: a bridge drops what comes back to its own site."""
KINDS: Final = frozenset({"send", "request", "publish"})
ANSWER_PROGRESS: Final = "p"
ANSWER_REPLY: Final = "r"
ANSWER_ERROR: Final = "e"
MAX_ANNOUNCED: Final = 1024  # agents in one site's announcement
MAX_BUDGET_MS: Final = 24 * 3600 * 1000
MAX_CONTRACTS: Final = 32  # contract records of one announced agent


def pack(obj: Any) -> bytes:
    return P.pack(obj)


def _unpack(data: bytes, max_bytes: int) -> dict[str, Any]:
    if len(data) > max_bytes:
        raise ValidationFailed(f"{len(data)} bytes from NATS, more than the {max_bytes} allowed")
    try:
        obj = P.unpack_body(data, max_bytes)
    except Exception as exc:
        raise ValidationFailed(f"undecodable message from NATS: {exc}") from None
    if not isinstance(obj, dict):
        raise ValidationFailed("a message from NATS must be a map")
    return obj


@dataclass(frozen=True, slots=True)
class Crossing:
    """One mesh message on its way to another site: ``sender`` site-qualified, ``to`` a plain
    name of the destination site, ``budget_ms`` the time the requester had left when it left."""

    kind: str
    id: str
    sender: str
    to: str
    topic: str
    payload: Any = None
    budget_ms: int | None = None
    hops: int = 0
    qos: int = 0
    headers: dict[str, Any] = field(default_factory=dict)
    version: str | None = None

    def pack(self) -> bytes:
        out: dict[str, Any] = {"k": self.kind, "i": self.id, "f": self.sender, "t": self.to,
                               "o": self.topic, "p": self.payload, "h": self.hops, "q": self.qos}
        if self.budget_ms is not None:
            out["b"] = self.budget_ms
        if self.headers:
            out["hd"] = self.headers
        if self.version is not None:
            out["sv"] = self.version
        return pack(out)


def unpack_crossing(data: bytes, max_bytes: int) -> Crossing:
    m = _unpack(data, max_bytes)
    kind, msg_id, sender, to, topic = m.get("k"), m.get("i"), m.get("f"), m.get("t", ""), m.get("o")
    hops, qos, budget = m.get("h", 0), m.get("q", 0), m.get("b")
    headers, version = m.get("hd", {}), m.get("sv")
    if kind not in KINDS:
        raise ValidationFailed(f"unknown kind {P.safe_repr(kind)}")
    if not isinstance(msg_id, str) or not 0 < len(msg_id) <= 128:
        raise ValidationFailed("bad message id")
    if not isinstance(sender, str) or not P.valid_name(sender):
        raise ValidationFailed(f"bad sender {P.safe_repr(sender)}")
    if kind != "publish" and not P.valid_name(to):
        raise ValidationFailed(f"bad destination {P.safe_repr(to)}")
    if not isinstance(topic, str) or not P.valid_topic(topic):
        raise ValidationFailed(f"bad topic {P.safe_repr(topic)}")
    if type(hops) is not int or not 0 <= hops <= 255 or qos not in (0, 1):
        raise ValidationFailed("hops or qos out of range")
    if budget is not None and (type(budget) is not int or not 0 <= budget <= MAX_BUDGET_MS):
        raise ValidationFailed("budget out of range")
    if not isinstance(headers, dict) or (version is not None and not isinstance(version, str)):
        raise ValidationFailed("bad headers or version")
    return Crossing(kind, msg_id, sender, str(to), topic, m.get("p"), budget, hops, qos, headers, version)


def unpack_answer(data: bytes, max_bytes: int) -> tuple[str, Any]:
    """``(ANSWER_PROGRESS, note)``, ``(ANSWER_REPLY, payload)`` or ``(ANSWER_ERROR, error map)``."""
    m = _unpack(data, max_bytes)
    kind = m.get("k")
    if kind == ANSWER_PROGRESS:
        return kind, str(m.get("n", ""))[:1000]
    if kind == ANSWER_REPLY:
        return kind, m.get("p")
    if kind == ANSWER_ERROR and isinstance(m.get("e"), dict):
        return kind, m["e"]
    raise ValidationFailed(f"unknown answer {P.safe_repr(kind)}")


def answer(kind: str, value: Any) -> bytes:
    key = "e" if kind == ANSWER_ERROR else "n" if kind == ANSWER_PROGRESS else "p"
    return pack({"k": kind, key: value})


def cancel(msg_id: str) -> bytes:
    return pack({"i": msg_id})


def unpack_cancel(data: bytes) -> str:
    """The id of the request a cancel names."""
    msg_id = _unpack(data, 1024).get("i")
    if not isinstance(msg_id, str) or not 0 < len(msg_id) <= 128:
        raise ValidationFailed("bad cancel")
    return msg_id


def announcement(site: str, agents: list[dict[str, Any]]) -> bytes:
    return pack({"site": site, "agents": agents[:MAX_ANNOUNCED]})


def unpack_announcement(data: bytes, max_bytes: int) -> tuple[str, list[dict[str, Any]]]:
    """A site's agents: each ``{"name", "capabilities", "topics", "contracts"}``, checked; bad
    entries skipped. Contract records are checked again by the daemon the proxy registers with."""
    m = _unpack(data, max_bytes)
    site, agents = m.get("site"), m.get("agents")
    if not isinstance(site, str) or not isinstance(agents, list) or len(agents) > MAX_ANNOUNCED:
        raise ValidationFailed("bad directory announcement")
    out = []
    for rec in agents:
        if not isinstance(rec, dict) or not P.valid_name(rec.get("name")):
            continue
        caps = [c for c in rec.get("capabilities") or [] if isinstance(c, str)][:32]
        topics = [t for t in rec.get("topics") or [] if P.valid_topic(t)][:64]
        contracts = [c for c in rec.get("contracts") or [] if isinstance(c, dict)][:MAX_CONTRACTS]
        out.append({"name": rec["name"], "capabilities": caps, "topics": topics, "contracts": contracts})
    return site, out
