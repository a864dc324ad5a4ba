"""The meshd wire format: frames, header fields, kinds, limits. Pure: no sockets here.

Every meshd message is one ZeroMQ multipart message::

    [SIGNATURE, header, payload]                       a single message

    [SIGNATURE, batch-header, body]                    a batch to one destination

``SIGNATURE`` is ``b"MSH"`` plus one protocol-version byte. The header is a small msgpack map
(keys below); the payload is opaque bytes that daemons route but never decode. A batch is three
frames: its body is ONE msgpack array of ``[header, payload]`` pairs (``pack_batch`` /
``split_batch``). The batch header carries everything routing needs (``to`` or ``topic``,
``from``), so a daemon forwards the whole batch as one unit after decoding one small map.
docs/PROTOCOL.md is the normative description.

This module owns: the frame layout, header keys and kinds, limits, error codes, the typed
:class:`Header` (decoded and range-checked once, at the edge: ``decode_header``), the one frame
builder (``frames``) and the one error-body builder (``error_body`` / ``error_header``).
It must not touch sockets, the clock of another module, or any daemon state.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Mapping
from itertools import count
from typing import Any, Final, NamedTuple

import msgpack

from meshd.errors import MeshError

PROTOCOL_VERSION: Final = 1
SIGNATURE: Final = b"MSH" + bytes([PROTOCOL_VERSION])

# Header keys (one place, so the docs, the client and the daemon agree).
KIND: Final = "kind"
ID: Final = "id"
FROM: Final = "from"
TO: Final = "to"
TOPIC: Final = "topic"
CORR: Final = "corr"
HOPS: Final = "hops"
BUDGET: Final = "budget"  # a request's time budget: milliseconds left when it was sent (a duration)
DEADLINE: Final = "deadline"  # deprecated (protocol 1 only): an absolute Unix time; see local_deadline
QOS: Final = "qos"
PRIO: Final = "prio"  # 0 (urgent, served first) .. 9; absent = 5 (docs/PROTOCOL.md §5, priorities)
MAX_PRIORITY: Final = 9
DEFAULT_PRIORITY: Final = 5
HEADERS: Final = "headers"
ERROR: Final = "error"
COUNT: Final = "count"
WHAT: Final = "what"
NODE: Final = "node"
VER: Final = "ver"  # directory version, on daemon heartbeats and directory messages
ORIGIN: Final = "origin"  # a delegated request's original requester (the reply goes there)
READ: Final = "read"  # credit: work messages the agent has read in all (docs/PROTOCOL.md, credit)
MAX_CREDIT: Final = 10_000
"""The largest credit window a client may ask for at register."""
IDS: Final = "ids"  # acked qos-1 unit ids (ack), or the message ids one error envelope covers
STATUS: Final = "status"  # a handoff reply's verdict: "accepted" or "rejected"
NOTE: Final = "note"  # a progress report's short text
OP: Final = "op"  # an admin call's operation
SEQ: Final = "seq"  # a daemon's HELLO/heartbeat sequence number (both-ways liveness, §9.5)
ECHO: Final = "echo"  # the last SEQ the sender heard from the receiver (both-ways liveness, §9.5)
NOTICE: Final = "notice"  # in an error map: it answers no call (the answer lane's notice room, §8.2)
TIMESTAMP: Final = "ts"  # when the message was made: ISO-8601 UTC, for people and logs only (§5)
SCHEMA_VERSION: Final = "sv"  # the contract version a message was written for, "MAJOR.MINOR" (§17)
KINDS: Final = "kinds"  # on a batch header: its inner kinds (only batches with answers/requests are opened)


class Kind:
    """Message kinds. Strings, so a capture or a client in another language stays readable."""

    # agent <-> daemon control
    REGISTER: Final = "register"
    UNREGISTER: Final = "unregister"
    SUBSCRIBE: Final = "subscribe"
    UNSUBSCRIBE: Final = "unsubscribe"
    QUERY: Final = "query"
    AGENT_HEARTBEAT: Final = "agent_hb"
    OK: Final = "ok"
    PING: Final = "ping"
    ACK: Final = "ack"
    NACK: Final = "nack"  # a qos-1 unit refused by its handler (with retry hints), agent and mesh
    ADMIN: Final = "admin"
    CREDIT: Final = "credit"  # agent -> daemon in credit mode: how many work messages it has read
    # routed between agents
    SEND: Final = "send"
    REQUEST: Final = "request"
    REPLY: Final = "reply"
    ERROR: Final = "error"
    PROGRESS: Final = "progress"
    CANCEL: Final = "cancel"
    PUBLISH: Final = "publish"
    BATCH: Final = "batch"
    # daemon <-> daemon control
    HELLO: Final = "hello"
    HEARTBEAT: Final = "hb"
    DIRECTORY: Final = "dir"
    SYNC: Final = "sync"
    BYE: Final = "bye"


ROUTED_KINDS: Final = frozenset(
    {Kind.SEND, Kind.REQUEST, Kind.REPLY, Kind.ERROR, Kind.PROGRESS, Kind.CANCEL}
)
AGENT_CONTROL_KINDS: Final = frozenset(
    {Kind.REGISTER, Kind.UNREGISTER, Kind.SUBSCRIBE, Kind.UNSUBSCRIBE, Kind.QUERY, Kind.AGENT_HEARTBEAT,
     Kind.ACK, Kind.NACK, Kind.ADMIN, Kind.CREDIT}
)
PEER_CONTROL_KINDS: Final = frozenset(
    {Kind.HELLO, Kind.HEARTBEAT, Kind.DIRECTORY, Kind.SYNC, Kind.BYE, Kind.ACK, Kind.NACK}
)
KNOWN_KINDS: Final = (
    ROUTED_KINDS
    | AGENT_CONTROL_KINDS
    | PEER_CONTROL_KINDS
    | {Kind.OK, Kind.PING, Kind.PUBLISH, Kind.BATCH}
)


class ErrorCode:
    """Error codes carried in ``error`` envelopes; each maps to a class in meshd.errors."""

    NO_SUCH_AGENT: Final = "NO_SUCH_AGENT"
    NAME_TAKEN: Final = "NAME_TAKEN"
    INBOX_FULL: Final = "INBOX_FULL"
    HOP_LIMIT: Final = "HOP_LIMIT"
    PEER_UNREACHABLE: Final = "PEER_UNREACHABLE"
    HANDLER_ERROR: Final = "HANDLER_ERROR"
    TIMEOUT: Final = "TIMEOUT"
    VALIDATION_FAILED: Final = "VALIDATION_FAILED"
    TOO_LARGE: Final = "TOO_LARGE"
    NOT_REGISTERED: Final = "NOT_REGISTERED"
    CANCELLED: Final = "CANCELLED"
    UNDELIVERABLE: Final = "UNDELIVERABLE"
    FORBIDDEN: Final = "FORBIDDEN"
    OUTBOX_FULL: Final = "OUTBOX_FULL"
    STORAGE_FULL: Final = "STORAGE_FULL"
    PUBLICATIONS_MISSED: Final = "PUBLICATIONS_MISSED"
    DAEMON_STOPPING: Final = "DAEMON_STOPPING"
    SCHEMA_VERSION: Final = "SCHEMA_VERSION"
    NACK: Final = "NACK"


HANDOFF_TOPIC: Final = "handoff-task"
"""The topic of handoff requests; the reply header's ``status`` says accepted or rejected."""

# Limits. Sizes are checked before anything is decoded.
MAX_HEADER_BYTES: Final = 8 * 1024
DEFAULT_MAX_PAYLOAD_BYTES: Final = 1024 * 1024
MAX_BATCH: Final = 256
BATCH_OVERHEAD: Final = 64 * 1024
"""A batch body may exceed max_payload_bytes by this much (its inner headers and framing)."""
MAX_NAME_LEN: Final = 128
MAX_TOPIC_LEN: Final = 256
MAX_ADDRESS_LEN: Final = MAX_NAME_LEN + 1 + 256
"""``to``, ``from`` and ``origin``: ``name`` or ``name@node`` (a node id or a host name)."""
MAX_ID_LEN: Final = 256
MAX_HOPS: Final = 255
MAX_TIMESTAMP_LEN: Final = 40
"""The longest ``ts`` a header may carry (``2026-12-03T06:35:47.123Z`` is 24)."""
MAX_BUDGET_MS: Final = 10**12  # about 31 years: any finite budget a client means fits
"""The largest ``hops`` a header may carry; the configured ``hop_limit`` (at most 64) is lower."""


class FrameError(MeshError, ValueError):
    """A frame set that is not valid meshd protocol. ``reason`` is a short, countable label."""

    code = "BAD_FRAME"

    def __init__(self, reason: str, detail: str = "", *, fields: dict[str, Any] | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        #: The decoded header map when only a field's value was wrong (so a refusal can name the
        #: message's id); None when the header itself could not be decoded.
        self.fields = fields


_DECODE_ERRORS: Final = (
    ValueError,
    TypeError,
    msgpack.ExtraData,
    msgpack.FormatError,
    msgpack.StackError,
    msgpack.OutOfData,
)

_packer = msgpack.Packer(use_bin_type=True)


def pack(obj: Any) -> bytes:
    """msgpack-encode ``obj`` (bin type on, so bytes stay bytes)."""
    packed: bytes = _packer.pack(obj)
    return packed


def _no_ext(code: int, data: bytes) -> Any:
    raise ValueError(f"msgpack ext type {code} not allowed")


def unpack_header(data: bytes | memoryview) -> dict[str, Any]:
    """Decode a header frame, bounded and strict. Raises FrameError, never anything else."""
    if len(data) > MAX_HEADER_BYTES:
        raise FrameError("header_too_large", f"{len(data)} > {MAX_HEADER_BYTES} bytes")
    try:
        header = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_no_ext,
            max_str_len=MAX_HEADER_BYTES,
            max_bin_len=MAX_HEADER_BYTES,
            max_array_len=1024,
            max_map_len=64,
            max_ext_len=0,
        )
    except _DECODE_ERRORS as exc:
        raise FrameError("header_undecodable", str(exc)) from None
    if not isinstance(header, dict):
        raise FrameError("header_not_map", type(header).__name__)
    kind = header.get(KIND)
    if not isinstance(kind, str) or kind not in KNOWN_KINDS:  # a list or map kind is unhashable
        msg_id = header.get(ID)
        named = isinstance(msg_id, str) and len(msg_id) <= MAX_ID_LEN
        raise FrameError("unknown_kind", safe_repr(kind), fields={ID: msg_id} if named else None)
    return header


def safe_repr(value: Any, limit: int = 64) -> str:
    """``repr`` of untrusted input for a message or a log line: short, and never recursing into a
    container (a name nested 1,000 deep once raised RecursionError while building an error)."""
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return repr(value[:limit] if isinstance(value, (str, bytes)) else value)[:limit + 8]
    return f"<{type(value).__name__}>"


def unpack_body(data: bytes | memoryview, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Any:
    """Decode a control payload (daemon-addressed kinds only). Raises FrameError."""
    if len(data) > max_bytes:
        raise FrameError("payload_too_large", f"{len(data)} > {max_bytes} bytes")
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_no_ext)
    except _DECODE_ERRORS as exc:
        raise FrameError("payload_undecodable", str(exc)) from None


def check_signature(frame: bytes | memoryview) -> None:
    """Raise FrameError unless ``frame`` is this protocol's signature and version."""
    if frame == SIGNATURE:
        return
    raw = bytes(frame)
    if raw[:3] == SIGNATURE[:3] and len(raw) == 4:
        raise FrameError("unsupported_version", f"version {raw[3]}, expected {PROTOCOL_VERSION}")
    raise FrameError("bad_signature", repr(raw[:8]))


def decode_routed(frames: list[Any]) -> dict[str, Any]:
    """Check ``[routing-id, signature, header, payload]`` as a ROUTER receives it; return the header.

    Raises FrameError for a short frame set, a wrong signature or version, or a bad header.
    """
    if len(frames) < 4:
        raise FrameError("too_few_frames", str(len(frames)))
    check_signature(frames[1])
    return unpack_header(frames[2])


class Header(NamedTuple):
    """A header decoded and range-checked once at the edge; nothing downstream re-parses it.

    The routing fields are typed attributes; ``fields`` is the whole decoded map (for the rare
    keys: ``error``, ``ids``, ``what``, ``op``, ``ver``, ``status``, ``count``, and for dead
    letters). Forwarding keeps the raw frames: a Header is never re-encoded on the way.

    A named tuple (read-only, like the frozen dataclass it was): one is built per message at every
    edge, and the frozen dataclass's ``__init__`` (an ``object.__setattr__`` per field) cost
    ~1.1 us of it against ~0.2 us, built positionally in :func:`header_from_map`.
    """

    kind: str
    id: str | None
    sender: str | None  # the wire key is "from"
    to: str | None
    topic: str | None
    corr: str | None
    origin: str | None
    hops: int
    deadline: float | None  # this host's time.monotonic() when the budget runs out (set on decode)
    qos: int
    fields: Mapping[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        """A field by its wire key (for the rare keys that have no attribute)."""
        return self.fields.get(key, default)

    @property
    def reply_to(self) -> str | None:
        """Where answers and bounces go: a delegated request's origin, else its sender."""
        return self.origin or self.sender


def _str_field(fields: dict[str, Any], key: str, limit: int) -> str | None:
    value = fields.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise FrameError("bad_field", f"{key!r} must be a string of at most {limit} characters",
                         fields=fields)
    return value


def header_from_map(fields: dict[str, Any]) -> Header:
    """Check every routing field's type and range (a negative ``hops`` once bypassed the
    hop limit); raise FrameError ``bad_field`` (with ``fields`` set) for the first one out of range."""
    hops = fields.get(HOPS, 0)
    if type(hops) is not int or not 0 <= hops <= MAX_HOPS:
        raise FrameError("bad_field", f"'hops' must be an integer 0..{MAX_HOPS}, not {hops!r}"[:120],
                         fields=fields)
    qos = fields.get(QOS, 0)
    if qos is None:
        qos = 0
    if type(qos) is not int or qos not in (0, 1):
        raise FrameError("bad_field", f"'qos' must be 0 or 1, not {qos!r}"[:120], fields=fields)
    prio = fields.get(PRIO)
    if prio is not None and (type(prio) is not int or not 0 <= prio <= MAX_PRIORITY):
        raise FrameError("bad_field", f"'prio' must be an integer 0..{MAX_PRIORITY}, not {prio!r}"[:120],
                         fields=fields)
    deadline = local_deadline(fields)
    if TIMESTAMP in fields:
        ts = fields[TIMESTAMP]
        if type(ts) is not str or len(ts) > MAX_TIMESTAMP_LEN:
            raise FrameError("bad_field", f"'ts' must be an ISO-8601 string of at most {MAX_TIMESTAMP_LEN} "
                             "characters", fields=fields)
    if SCHEMA_VERSION in fields:
        sv = fields[SCHEMA_VERSION]
        if schema_version(sv) is None:
            raise FrameError("bad_field", f"'sv' must be a version 'MAJOR.MINOR', not {sv!r}"[:120],
                             fields=fields)
    return Header(  # positional: kind, id, sender, to, topic, corr, origin, hops, deadline, qos, fields
        fields[KIND],
        _str_field(fields, ID, MAX_ID_LEN),
        _str_field(fields, FROM, MAX_ADDRESS_LEN),
        _str_field(fields, TO, MAX_ADDRESS_LEN),
        _str_field(fields, TOPIC, MAX_TOPIC_LEN),
        _str_field(fields, CORR, MAX_ID_LEN),
        _str_field(fields, ORIGIN, MAX_ADDRESS_LEN),
        hops,
        deadline,
        qos,
        fields,
    )


_SCHEMA_VERSION_RE: Final = re.compile(r"([0-9]{1,5})\.([0-9]{1,5})")
MAX_VERSION_PART: Final = 65535


def schema_version(value: Any) -> tuple[int, int] | None:
    """``"1.2"`` -> ``(1, 2)``; None for anything else (not a string, "1", "1.2.3", a part past
    65535): the range check of the header's ``sv`` and of a contract record's ``version``."""
    if type(value) is not str or len(value) > 11:
        return None
    m = _SCHEMA_VERSION_RE.fullmatch(value)
    if m is None:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    if major > MAX_VERSION_PART or minor > MAX_VERSION_PART:
        return None
    return major, minor


def decode_header(data: bytes | memoryview) -> Header:
    """Decode and range-check one header frame. Raises FrameError, never anything else."""
    return header_from_map(unpack_header(data))


def decode_routed_header(msg: list[Any]) -> Header:
    """``decode_routed`` returning the typed :class:`Header` (the daemons' edge)."""
    return header_from_map(decode_routed(msg))


def pack_batch(items: list[tuple[dict[str, Any], bytes]]) -> bytes:
    """The body frame of a batch: a msgpack array of ``[header-map, payload-bytes]`` pairs.

    The whole batch body is one frame, so a daemon forwards a batch of 64 as 3 frames, not 130.
    """
    return pack([[header, payload] for header, payload in items])


def split_batch(msg: list[Any]) -> list[tuple[dict[str, Any], bytes]]:
    """Decode a batch's body (``msg`` is ``[signature, batch-header, body]``); bounded and strict."""
    if len(msg) != 3:
        raise FrameError("batch_frames", f"a batch has 3 frames, not {len(msg)}")
    body = msg[2]
    try:
        items = msgpack.unpackb(
            body, raw=False, strict_map_key=True, ext_hook=_no_ext, max_array_len=MAX_BATCH,
            max_map_len=64, max_ext_len=0,
        )
    except _DECODE_ERRORS as exc:
        raise FrameError("batch_undecodable", str(exc)) from None
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise FrameError("batch_shape", f"expected 1..{MAX_BATCH} [header, payload] pairs")
    pairs: list[tuple[dict[str, Any], bytes]] = []
    append = pairs.append
    for item in items:
        # msgpack builds exact list, dict, bytes and str objects: ``type(x) is`` checks the same
        # as isinstance here, for less per item (every message of every batch passes here).
        if type(item) is not list or len(item) != 2:
            raise FrameError("batch_item", "each item is [header map with a known kind, payload bytes]")
        header, payload = item
        if (type(header) is not dict or type(payload) is not bytes
                or type(kind := header.get(KIND)) is not str  # {kind: {}} is unhashable: TypeError once
                or kind not in KNOWN_KINDS):
            raise FrameError("batch_item", "each item is [header map with a known kind, payload bytes]")
        append((header, payload))
    return pairs


ACK_ID_BYTES: Final = MAX_HEADER_BYTES // 2
"""Bytes of ids one ``ack`` header carries at most (msgpack overhead counted generously)."""
ACK_IDS: Final = 256
"""Ids one ``ack`` header carries at most (headers allow arrays of 1024)."""


def chunk_ids(ids: list[str]) -> list[list[str]]:
    """Split acked ids so that each ``ack`` header stays well within MAX_HEADER_BYTES (one
    ack of ~500 ids was 8.4 KB and refused, so those units were never acked)."""
    chunks: list[list[str]] = []
    chunk: list[str] = []
    size = 0
    for unit in ids:
        if chunk and (size + len(unit) + 8 > ACK_ID_BYTES or len(chunk) >= ACK_IDS):
            chunks.append(chunk)
            chunk, size = [], 0
        chunk.append(unit)
        size += len(unit) + 8
    if chunk:
        chunks.append(chunk)
    return chunks


def frames(header: Mapping[str, Any], payload: bytes = b"") -> list[bytes]:
    """The one frame builder: ``[SIGNATURE, header, payload]`` of a single message."""
    return [SIGNATURE, _packer.pack(header), payload]


def error_body(code: str, message: str, *, retry: bool = False, retry_after: float | None = None,
               remote_type: str | None = None, fallback: str | None = None,
               details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The one error-body builder: the ``error`` map of an error envelope (docs/PROTOCOL.md §7).
    ``details``: a contract's refusal names ``field``, ``topic``, ``version``, ``supported``."""
    err: dict[str, Any] = {"code": code, "message": message, "retry": retry}
    if retry_after is not None:
        err["retry_after"] = retry_after
    if remote_type:
        err["type"] = remote_type
    if fallback:
        err["fallback"] = fallback
    if details:
        for key in ERROR_DETAIL_KEYS:
            if key in details:
                err[key] = details[key]
    return err


ERROR_DETAIL_KEYS: Final = ("field", "topic", "version", "supported")
"""Optional keys of an ``error`` map that say what a contract refused (docs/PROTOCOL.md §7)."""


def error_header(
    to: str | None, corr: str | None, code: str, message: str, *, retry: bool = False,
    retry_after: float | None = None, sender: str | None = None, notice: bool = False,
) -> dict[str, Any]:
    """Header of an error envelope addressed back to the sender of a failed message.

    ``notice``: it answers nothing the client awaits (a qos-0 send refused, a publisher's pause,
    a gap notice): ``notice: true`` in the ``error`` map, so that daemons hold it in the answer
    lane's notice room, not in the room kept for answers to calls (docs/PROTOCOL.md §8.2)."""
    err = error_body(code, message, retry=retry, retry_after=retry_after)
    if notice:
        err[NOTICE] = True
    header: dict[str, Any] = {KIND: Kind.ERROR, ID: new_id(), ERROR: err, TIMESTAMP: timestamp()}
    if to is not None:
        header[TO] = to
    if corr is not None:
        header[CORR] = corr
    if sender is not None:
        header[FROM] = sender
    return header


_id_prefix = os.urandom(6).hex()
_id_counter = count(1)


CREDIT_WORK_KINDS: Final = frozenset({Kind.SEND, Kind.REQUEST})
"""Kinds that take credit (docs/PROTOCOL.md §8.11): sends and requests (publications keep their
own hold at the subscriber's daemon, §8.4, and take none)."""


def credit_count(kind: Any, kinds: Any, count: Any) -> int:
    """The credit one frame set to an agent takes, from its top-level header's ``kind``, ``kinds``
    and ``count`` (§8.11): a send or request 1; a batch whose declared kinds are all sends or
    requests its ``count``; anything else 0. The daemon and the client both count with this, so they
    agree whatever a hostile sender put inside a batch."""
    if kind != Kind.BATCH:
        return 1 if kind in CREDIT_WORK_KINDS else 0
    if isinstance(kinds, list) and kinds and type(count) is int and 0 < count <= MAX_BATCH and \
            all(k in CREDIT_WORK_KINDS for k in kinds if isinstance(k, str)) and \
            all(isinstance(k, str) for k in kinds):
        return count
    return 0


def is_notice(header: Mapping[str, Any] | Header) -> bool:
    """An error envelope that answers nothing the client awaits (``error_header(notice=True)``)."""
    err = header.get(ERROR)
    return isinstance(err, dict) and err.get(NOTICE) is True


def new_id() -> str:
    """A message id unique across processes: a random per-process prefix and a counter."""
    return f"{_id_prefix}{next(_id_counter):x}"


def new_request_id() -> str:
    """A request's id, which becomes its correlation id: 128 random bits, so no other agent can
    guess it and forge an answer (``new_id``'s visible prefix plus counter is guessable)."""
    return os.urandom(16).hex()


DAEMON_PREFIX: Final = "meshd@"
"""``from`` of what a daemon itself sends (``meshd@<node id>``); agent names never contain '@'."""


def topic_key(topic: str) -> bytes:
    """The PUB/SUB envelope frame for ``topic``: exact match, never a prefix of another topic."""
    return topic.encode() + b"\x00"


def valid_name(name: Any) -> bool:
    """Agent names: 1-128 printable characters, no '@' (that separates name and node) or spaces."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME_LEN
        and "@" not in name
        and name.isprintable()
        and not any(ch.isspace() for ch in name)
    )


def valid_topic(topic: Any) -> bool:
    """Topics: 1-256 printable characters without NUL."""
    return isinstance(topic, str) and 0 < len(topic) <= MAX_TOPIC_LEN and topic.isprintable()


_stamp_second = -1
_stamp_prefix = ""
_stamp_ms = -1
_stamp = ""


def timestamp() -> str:
    """Now as an ISO-8601 UTC string with milliseconds (``2026-12-03T06:35:47.123Z``): the
    ``ts`` of a message, for people and logs. Never compared across hosts (budgets are
    durations). It is on every message's path: the string is made once per millisecond, its
    date part once per second."""
    global _stamp_second, _stamp_prefix, _stamp_ms, _stamp
    ms = int(time.time() * 1000)
    if ms == _stamp_ms:
        return _stamp
    second = ms // 1000
    if second != _stamp_second:
        _stamp_second, _stamp_prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    _stamp_ms, _stamp = ms, f"{_stamp_prefix}.{ms % 1000:03d}Z"
    return _stamp


def now() -> float:
    """Wall-clock seconds, for what is shown to people only (never compared across hosts)."""
    return time.time()


def budget_ms(seconds: float) -> int:
    """A time budget for the wire: ``seconds`` as whole milliseconds, rounded up, never negative."""
    return max(0, math.ceil(seconds * 1000.0))


def budget_left(deadline: float) -> int:
    """What is left of a local ``time.monotonic()`` deadline, as a wire budget (ms)."""
    return budget_ms(deadline - time.monotonic())


def local_deadline(fields: Mapping[str, Any]) -> float | None:
    """The time limit a header carries, turned into this host's ``time.monotonic()`` deadline.

    Call it when the message arrives: ``budget`` (ms left when it was sent) starts counting
    here, on this host's monotonic clock, so no two hosts' clocks are ever compared. The
    deprecated ``deadline`` (an absolute Unix time, from older protocol 1 clients) is still
    accepted for one version, converted with this host's wall clock (so it is only as right as
    the two clocks agree); ``budget`` wins when both are present. Raises FrameError
    ``bad_field`` for a value that is not a finite, non-negative number.
    """
    budget = fields.get(BUDGET)
    if budget is not None:
        if type(budget) not in (int, float) or not math.isfinite(budget) or not 0 <= budget <= MAX_BUDGET_MS:
            raise FrameError("bad_field", f"'budget' must be a non-negative number of milliseconds "
                             f"(at most {MAX_BUDGET_MS}), not {budget!r}"[:120], fields=dict(fields))
        return time.monotonic() + float(budget) / 1000.0
    deadline = fields.get(DEADLINE)
    if deadline is None:
        return None
    if type(deadline) not in (int, float) or not math.isfinite(deadline) or deadline < 0:
        raise FrameError("bad_field", f"'deadline' must be a finite, non-negative time, not "
                         f"{deadline!r}"[:120], fields=dict(fields))
    return time.monotonic() + (float(deadline) - time.time())
