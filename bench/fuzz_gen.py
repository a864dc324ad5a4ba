"""Frame generation for the fuzz campaign (bench/fuzz.py): fast, seeded, reproducible.

Owns: the hypothesis pool (a few thousand frame sets drawn once: signature right or wrong, a
header built from the protocol's own kinds and keys with values of any type and depth, raw
bytes, 0-5 more frames) and the mutator that turns the pool into any number of frame sets with a
seeded ``random.Random`` (bit flips, truncation, type swaps, huge and negative integers, NaN and
infinities, deep nesting, oversized fields, batches with hostile items, extra and missing
frames). Drawing from hypothesis per frame ran at ~200 frame sets/s; the pool plus mutation runs
at tens of thousands per second, so the campaign is bounded by the daemon, not the generator.
It also owns :func:`expected_corrs`: which answers the daemon owes an unregistered connection
for a frame set (docs/PROTOCOL.md §7.1, "never as silence", and its limits).
It must not touch sockets or daemons (fuzz.py does).
"""

from __future__ import annotations

import math
import random
from typing import Any

import msgpack
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from meshd.delivery.router import (
    _id_of,  # the rule a refused frame set is answered by, as the daemon applies it
)
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind

ALL_KINDS = sorted(P.KNOWN_KINDS)
KEYS = sorted({v for k, v in vars(P).items() if k.isupper() and isinstance(v, str) and len(v) < 16}
              - {"MSH", "meshd@", "handoff-task"})
ADMIN_OPS = ["deadletters.list", "deadletters.show", "deadletters.replay", "peers.discovered"]
"""Real admin ops (``doctor`` left out: it may ask for an mDNS query)."""
QUERY_WHATS = ["agents", "peers", "node"]

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                     st.text(max_size=40), st.binary(max_size=40))
_values = st.recursive(
    _scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4),
                           st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12)
_headers = st.fixed_dictionaries(
    {"kind": st.one_of(st.sampled_from(ALL_KINDS), _values),
     "id": st.one_of(st.text(min_size=1, max_size=24), _values)},
    optional={k: _values for k in KEYS if k not in ("kind", "id")})
_plausible = st.fixed_dictionaries(  # near-valid headers, so many frames reach the deeper checks
    {"kind": st.sampled_from(ALL_KINDS), "id": st.text(min_size=1, max_size=24)},
    optional={k: _scalars for k in ("to", "from", "topic", "corr", "hops", "qos", "budget", "what", "op",
                                    "origin", "kinds")})
_signatures = st.one_of(st.just(P.SIGNATURE), st.just(P.SIGNATURE), st.binary(max_size=6))
_header_objs = st.one_of(_plausible, _plausible, _headers, st.binary(max_size=64))
POOL_ITEM = tuple[bytes, "dict[str, Any] | bytes", list[bytes]]
_pool_items = st.tuples(_signatures, _header_objs, st.lists(st.binary(max_size=64), max_size=5))


def draw_pool(size: int, seed: int) -> list[tuple[bytes, Any, list[bytes]]]:
    """``size`` frame sets drawn by hypothesis (seeded): header maps are kept unpacked, so the
    mutator can change one field and pack again."""
    pool: list[tuple[bytes, Any, list[bytes]]] = []

    @settings(max_examples=size, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(_pool_items)
    def one(item: tuple[bytes, Any, list[bytes]]) -> None:
        pool.append(item)

    one._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    one()
    return pool


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


class Mutator:
    """Any number of frame sets from a pool, with a seeded ``random.Random``."""

    NASTY_INTS = [0, 1, -1, 2, 255, 256, 2**31, -2**31, 2**63 - 1, -2**63, 2**64 - 1, 10**12, 10**12 + 1]
    MARKERS = [0xC1, 0xD4, 0xC7, 0xDC, 0xDE, 0xDD, 0xDF, 0xCF, 0xD3, 0x90]  # ext, arrays, maps, big ints
    NASTY_FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.5, 1e308, -1e-308, 3.0, 30000.0]

    def __init__(self, pool: list[tuple[bytes, Any, list[bytes]]], seed: int, *,
                 kinds: list[str] | None = None, targets: list[str] | None = None,
                 sender: str | None = None) -> None:
        self.pool = pool
        self.rng = random.Random(seed)
        self.kinds = kinds or ALL_KINDS
        #: Live agents some headers are addressed to (a fifth of them), so hostile messages reach
        #: their client library too, not only the daemon's checks.
        self.targets = targets or []
        #: A registered connection's name, put in ``from`` of most headers (else they are refused
        #: at the first check).
        self.sender = sender
        self.serial = 0

    def nasty(self) -> Any:
        r = self.rng
        pick = r.randrange(12)
        if pick == 0:
            return r.choice(self.NASTY_INTS)
        if pick == 1:
            return r.choice(self.NASTY_FLOATS)
        if pick == 2:
            return r.choice([None, True, False, "", b"", [], {}])
        if pick == 3:
            return "x" * r.choice([127, 128, 129, 256, 257, 385, 400, 4000, 9000])  # around each limit
        if pick == 4:
            return r.choice(["\x00", "a b", "a@b", "a@b@c", "\u202e\u0000", "é" * 100, "meshd.sys.x", "*"])
        if pick == 5:
            return _nested(r.choice([2, 16, 64, 200, 600]), r.choice([1, "x", None]))
        if pick == 6:
            return [r.choice(self.NASTY_INTS) for _ in range(r.choice([1, 3, 300, 1025]))]
        if pick == 7:
            return {str(i): i for i in range(r.choice([1, 10, 65]))}
        if pick == 8:
            return r.choice(self.kinds)
        if pick == 9:
            return r.choice(ADMIN_OPS + QUERY_WHATS)
        if pick == 10:
            return r.randbytes(r.choice([1, 8, 64]))
        return r.choice(["fz-echo", "fz-ask", "nobody", "nobody@nowhere", "fz-echo@" + "n" * 8])

    def header_map(self, base: dict[str, Any]) -> dict[str, Any]:
        r = self.rng
        h = dict(base)
        if r.random() < 0.5:
            h["kind"] = r.choice(self.kinds)
        for _ in range(r.choice([0, 1, 1, 2, 3])):
            op = r.randrange(4)
            if op == 0 and h:
                h.pop(r.choice(list(h)), None)
            else:
                h[r.choice(KEYS)] = self.nasty()
        if self.targets and r.random() < 0.2:
            h["to"] = r.choice(self.targets)
            h["kind"] = r.choice([Kind.SEND, Kind.REQUEST, Kind.REPLY, Kind.ERROR, Kind.PROGRESS, Kind.CANCEL,
                                  Kind.BATCH, h.get("kind")])
        if self.sender is not None and r.random() < 0.8:
            h["from"] = self.sender
        if h.get("kind") == Kind.ADMIN and r.random() < 0.7:
            h["op"] = r.choice(ADMIN_OPS)
        if h.get("kind") == Kind.QUERY and r.random() < 0.7:
            h["what"] = r.choice(QUERY_WHATS)
        if r.random() < 0.85:  # a unique id, so each answer is matched to one frame set
            self.serial += 1
            h["id"] = f"fz{self.serial:x}"
        return h

    def body(self, kind: Any) -> bytes:
        r = self.rng
        if kind == Kind.BATCH and r.random() < 0.6:
            items: list[Any] = []
            for _ in range(r.choice([1, 2, 5, 257])):
                _, inner, _ = r.choice(self.pool)
                inner = self.header_map(inner) if isinstance(inner, dict) else {"kind": r.choice(self.kinds)}
                items.append([inner, r.randbytes(r.randrange(8))] if r.random() < 0.9 else self.nasty())
            return self.pack(items)
        if r.random() < 0.4:
            return self.pack(r.choice([{"name": self.nasty()}, {"seq": self.nasty()}, {"name": "x",
                             "capabilities": self.nasty(), "metadata": self.nasty()}, self.nasty()]))
        if r.random() < 0.002:
            return b"\x00" * (P.DEFAULT_MAX_PAYLOAD_BYTES + r.choice([0, 1, 70_000]))
        return r.randbytes(r.randrange(64))

    @staticmethod
    def pack(obj: Any) -> bytes:
        try:
            return bytes(msgpack.packb(obj, use_bin_type=True))
        except (ValueError, OverflowError, TypeError):  # e.g. nesting past msgpack's own limit
            return b"\xc1"  # never used by msgpack: undecodable

    def bytes_mutate(self, data: bytes) -> bytes:
        r = self.rng
        op = r.randrange(5)
        if not data or op == 0:
            return data + r.randbytes(r.randrange(1, 16))
        if op == 1:  # bit flips
            buf = bytearray(data)
            for _ in range(r.choice([1, 1, 2, 4])):
                i = r.randrange(len(buf))
                buf[i] ^= 1 << r.randrange(8)
            return bytes(buf)
        if op == 2:  # truncation
            return data[:r.randrange(len(data))]
        if op == 3:  # a byte set to a msgpack type marker
            buf = bytearray(data)
            buf[r.randrange(len(buf))] = r.choice(self.MARKERS)
            return bytes(buf)
        return data * 2

    def next(self) -> list[bytes]:
        """One frame set (what a DEALER sends: no routing id)."""
        r = self.rng
        sig, header, rest = r.choice(self.pool)
        kind: Any = None
        if isinstance(header, dict):
            mapped = self.header_map(header)
            kind = mapped.get("kind")
            packed = self.pack(mapped)
        else:
            packed = bytes(header)
        if r.random() < 0.12:
            packed = self.bytes_mutate(packed)
        if r.random() < 0.1:
            sig = r.choice([P.SIGNATURE[:3] + b"\x02", P.SIGNATURE[:3], b"", sig, P.SIGNATURE + b"\x00"])
        elif r.random() < 0.7:
            sig = P.SIGNATURE
        shape = r.random()
        if shape < 0.55:
            tail = [self.body(kind)]
        elif shape < 0.65:
            tail = []
        elif shape < 0.75:
            tail = [self.body(kind), *[r.randbytes(r.randrange(8)) for _ in range(r.randrange(1, 6))]]
        elif shape < 0.76:
            tail = [b""] * r.choice([50, 1000])
        else:
            tail = list(rest)
        frames = [sig, packed, *tail]
        if r.random() < 0.01:
            frames = frames[:r.randrange(1, len(frames))]  # down to the signature alone
        return frames


_AGENT_DATA = P.ROUTED_KINDS | {Kind.PUBLISH, Kind.BATCH}


def expected_corrs(sent: list[bytes]) -> list[str] | None:
    """The ``corr`` values of the answers an unregistered connection must get for ``sent``
    (docs/PROTOCOL.md §7.1): one per frame set whose header decodes far enough to show a string
    ``id``, except ``agent_hb`` (answered, but with no ``corr``), ``ack``, ``nack`` and ``credit`` (never
    answered, §8.11); a
    refused batch is answered once per inner message. None for a ``register`` (the campaign sends
    it on a connection it does not check: registering changes what later frames get)."""
    frames = [b"rid", *sent]
    try:
        header = P.decode_routed_header(frames)
    except FrameError as exc:
        corr = exc.fields.get(P.ID) if exc.fields else _id_of(frames)
        return [corr] if isinstance(corr, str) else []
    kind = header.kind
    if kind == Kind.REGISTER:
        return None
    if kind in P.AGENT_CONTROL_KINDS and len(frames) == 4 and \
            kind in (Kind.AGENT_HEARTBEAT, Kind.ACK, Kind.NACK, Kind.CREDIT):
        return []
    if kind == Kind.BATCH and kind in _AGENT_DATA and len(frames) == 4:
        try:
            inner = [h.get(P.ID) for h, _ in P.split_batch(frames[1:])]
        except FrameError:
            pass
        else:
            return [i for i in inner if isinstance(i, str)]
    return [header.id] if header.id is not None else []
