"""The wire codec, without sockets: round trips, and hostile input rejected with a typed error."""

from __future__ import annotations

import time

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.errors import ERRORS_BY_CODE, MeshError, NoSuchAgent, error_from_wire
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind

header_values = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1),
                          st.floats(allow_nan=False), st.text(max_size=40), st.binary(max_size=40))
nested_values = st.recursive(
    header_values,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=20,
)


@given(
    kind=st.sampled_from(sorted(P.KNOWN_KINDS)),
    fields=st.dictionaries(st.sampled_from([P.ID, P.FROM, P.TO, P.TOPIC, P.CORR, P.HOPS, P.DEADLINE]),
                           header_values, max_size=7),
    payload=st.binary(max_size=512),
)
def test_encode_decode_round_trip(kind: str, fields: dict[str, object], payload: bytes) -> None:
    header = {P.KIND: kind, **fields}
    frames = P.frames(header, payload)
    assert frames[0] == P.SIGNATURE
    P.check_signature(frames[0])
    assert P.unpack_header(frames[1]) == header
    assert frames[2] == payload  # the payload is carried, never touched


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_garbage_header_is_a_frame_error(data: bytes) -> None:
    try:
        header = P.unpack_header(data)
    except FrameError as exc:
        assert exc.reason in {"header_undecodable", "header_not_map", "unknown_kind", "header_too_large"}
    else:  # the rare garbage that is a valid header must really be one
        assert isinstance(header, dict) and header[P.KIND] in P.KNOWN_KINDS


@given(nested_values)
def test_any_msgpack_value_never_crashes_the_decoder(value: object) -> None:
    data = msgpack.packb(value, use_bin_type=True)
    try:
        P.unpack_header(data)
    except FrameError:
        pass


@given(st.binary(min_size=0, max_size=8))
def test_bad_signatures_rejected(sig: bytes) -> None:
    if sig == P.SIGNATURE:
        return
    with pytest.raises(FrameError) as info:
        P.check_signature(sig)
    assert info.value.reason in {"bad_signature", "unsupported_version"}


def test_other_version_named() -> None:
    with pytest.raises(FrameError, match="version 9"):
        P.check_signature(b"MSH\x09")


def test_oversized_header_refused_before_decoding() -> None:
    big = msgpack.packb({P.KIND: Kind.SEND, "x": "a" * P.MAX_HEADER_BYTES})
    with pytest.raises(FrameError) as info:
        P.unpack_header(big)
    assert info.value.reason == "header_too_large"


def test_ext_types_refused() -> None:
    data = msgpack.packb({P.KIND: Kind.SEND, "x": msgpack.ExtType(5, b"abc")})
    with pytest.raises(FrameError):
        P.unpack_header(data)


def test_unknown_kind_refused() -> None:
    with pytest.raises(FrameError) as info:
        P.unpack_header(msgpack.packb({P.KIND: "launch-missiles"}))
    assert info.value.reason == "unknown_kind"


def test_batch_round_trip_and_limits() -> None:
    items = [({P.KIND: Kind.SEND, P.ID: "1"}, b"p1"), ({P.KIND: Kind.REQUEST, P.ID: "2"}, b"p2")]
    msg = [P.SIGNATURE, P.pack({P.KIND: Kind.BATCH, P.TO: "x"}), P.pack_batch(items)]
    assert P.split_batch(msg) == items
    with pytest.raises(FrameError):
        P.split_batch([P.SIGNATURE, b"batch"])  # the body frame is missing
    with pytest.raises(FrameError):
        P.split_batch([P.SIGNATURE, b"b", P.pack_batch([({P.KIND: Kind.SEND}, b"p")] * (P.MAX_BATCH + 1))])
    with pytest.raises(FrameError):
        P.split_batch([P.SIGNATURE, b"b", P.pack([[{P.KIND: "bogus"}, b"p"]])])
    with pytest.raises(FrameError):
        P.split_batch([P.SIGNATURE, b"b", P.pack([[{P.KIND: Kind.SEND}, "not bytes"]])])


@settings(max_examples=200)
@given(st.binary(max_size=300))
def test_garbage_batch_body_is_a_frame_error(body: bytes) -> None:
    try:
        pairs = P.split_batch([P.SIGNATURE, b"h", body])
    except FrameError:
        return
    assert all(isinstance(h, dict) and isinstance(p, bytes) for h, p in pairs)


def test_ids_unique() -> None:
    ids = {P.new_id() for _ in range(10000)}
    assert len(ids) == 10000


def test_topic_key_is_exact() -> None:
    assert not P.topic_key("newsletter").startswith(P.topic_key("news"))


@pytest.mark.parametrize("name,ok", [("planner", True), ("a@b", False), ("", False), ("x y", False),
                                     ("x" * 129, False), ("r-1.2_3", True), (5, False)])
def test_names(name: object, ok: bool) -> None:
    assert P.valid_name(name) is ok


def test_error_envelope_round_trip() -> None:
    header = P.error_header("planner", "abc", P.ErrorCode.NO_SUCH_AGENT, "gone", retry=False)
    decoded = P.unpack_header(P.pack(header))
    err = error_from_wire(decoded[P.ERROR])
    assert isinstance(err, NoSuchAgent) and isinstance(err, LookupError)
    assert err.message == "gone" and decoded[P.CORR] == "abc"


def test_every_error_code_has_a_class() -> None:
    codes = {v for k, v in vars(P.ErrorCode).items() if k.isupper()}
    assert codes <= set(ERRORS_BY_CODE)
    unknown = error_from_wire({"code": "SOMETHING_NEW", "message": "m"})
    assert type(unknown) is MeshError and unknown.code == "SOMETHING_NEW"


def test_header_is_decoded_once_into_typed_fields() -> None:
    data = P.pack({P.KIND: Kind.REQUEST, P.ID: "i1", P.FROM: "a", P.TO: "b@n", P.TOPIC: "t",
                   P.CORR: "c", P.ORIGIN: "o", P.HOPS: 3, P.BUDGET: 12_000, P.QOS: 1, "x-extra": [1]})
    before = time.monotonic()
    h = P.decode_header(data)
    after = time.monotonic()
    assert (h.kind, h.id, h.sender, h.to, h.topic, h.corr, h.origin) == (
        Kind.REQUEST, "i1", "a", "b@n", "t", "c", "o")
    assert h.hops == 3 and h.qos == 1 and h.deadline is not None
    assert before + 12.0 <= h.deadline <= after + 12.0  # the budget counts from arrival, here
    assert h.get("x-extra") == [1] and h.reply_to == "o"
    with pytest.raises(AttributeError):
        h.hops = 0  # type: ignore[misc]  # frozen
    bare = P.decode_header(P.pack({P.KIND: Kind.SEND}))
    assert (bare.hops, bare.qos, bare.deadline, bare.to) == (0, 0, None, None)


@pytest.mark.parametrize("key,value", [
    (P.HOPS, -1), (P.HOPS, -1_000_000), (P.HOPS, P.MAX_HOPS + 1), (P.HOPS, True), (P.HOPS, 1.0),
    (P.QOS, 2), (P.QOS, -1), (P.QOS, "1"), (P.DEADLINE, float("inf")), (P.DEADLINE, float("nan")),
    (P.DEADLINE, -0.5), (P.DEADLINE, "soon"), (P.BUDGET, -1), (P.BUDGET, float("inf")),
    (P.BUDGET, "5s"), (P.BUDGET, P.MAX_BUDGET_MS + 1), (P.TO, 5), (P.TO, "x" * (P.MAX_ADDRESS_LEN + 1)),
    (P.ID, b"bin"), (P.TOPIC, "t" * (P.MAX_TOPIC_LEN + 1)), (P.CORR, 7), (P.FROM, ["a"]),
])
def test_header_field_out_of_range_is_a_bad_field(key: str, value: object) -> None:
    fields = {P.KIND: Kind.REQUEST, P.ID: "keep-me", key: value}
    with pytest.raises(FrameError) as info:
        P.decode_header(P.pack(fields))
    assert info.value.reason == "bad_field"
    assert info.value.fields is not None and info.value.fields.get(P.ID) == (
        "keep-me" if key != P.ID else value)  # a refusal can name the message


@pytest.mark.parametrize("key,value", [(P.HOPS, 0), (P.HOPS, P.MAX_HOPS), (P.QOS, 0), (P.QOS, None),
                                       (P.DEADLINE, 0), (P.DEADLINE, 1.7e9), (P.BUDGET, 0),
                                       (P.BUDGET, 2.5), (P.BUDGET, P.MAX_BUDGET_MS)])
def test_header_field_in_range_is_accepted(key: str, value: object) -> None:
    P.decode_header(P.pack({P.KIND: Kind.SEND, key: value}))


def test_a_budget_is_a_duration_on_the_local_monotonic_clock() -> None:
    """No wall clock takes part in a budget (hosts' clocks differ); the wire carries milliseconds left."""
    assert P.budget_ms(5) == 5000 and P.budget_ms(0.0001) == 1 and P.budget_ms(-3) == 0
    deadline = time.monotonic() + 2.0
    assert 1900 <= P.budget_left(deadline) <= 2000
    assert P.budget_left(time.monotonic() - 1) == 0
    local = P.local_deadline({P.BUDGET: 1500, P.DEADLINE: 1.0})  # budget wins over the old field
    assert local is not None and 1.4 < local - time.monotonic() <= 1.5
    legacy = P.local_deadline({P.DEADLINE: time.time() + 3})  # protocol 1 clients, this host's clock
    assert legacy is not None and 2.9 < legacy - time.monotonic() <= 3.0
    assert P.local_deadline({}) is None


def test_one_error_body_builder() -> None:
    body = P.error_body("X", "m", retry=True, retry_after=0.5, remote_type="ValueError")
    assert body == {"code": "X", "message": "m", "retry": True, "retry_after": 0.5, "type": "ValueError"}
    assert P.error_header("to", "c", "X", "m", retry=True, retry_after=0.5)[P.ERROR] == {
        "code": "X", "message": "m", "retry": True, "retry_after": 0.5}


def test_chunk_ids_keeps_every_ack_header_within_the_cap() -> None:
    """Daemon-to-daemon and client acks are split (a header over the cap is refused); 256-char ids fit."""
    for ids in ([f"{n:x}" * 1 for n in range(2000)], ["x" * P.MAX_ID_LEN + str(n) for n in range(300)]):
        ids = [i[:P.MAX_ID_LEN] for i in ids]
        chunks = P.chunk_ids(ids)
        assert [i for c in chunks for i in c] == ids
        for chunk in chunks:
            header = P.pack({P.KIND: P.Kind.ACK, P.FROM: "f" * 16, P.IDS: chunk})
            assert P.unpack_header(header)[P.IDS] == chunk


@pytest.mark.parametrize("key,value", [
    (P.HOPS, 1.0), (P.HOPS, True), (P.HOPS, 3.5), (P.QOS, 1.0), (P.QOS, 0.0), (P.QOS, True), (P.QOS, False),
    (P.BUDGET, True), (P.BUDGET, float("nan")), (P.BUDGET, float("-inf")), (P.DEADLINE, True),
    (P.DEADLINE, float("inf")),
])
def test_numbers_integer_only_fields_refuse_floats_and_booleans(key: str, value: object) -> None:
    """docs/PROTOCOL.md §3: ``hops`` and ``qos`` are integers only (not even 1.0, never a boolean);
    ``budget`` and ``deadline`` take any finite number, but not a boolean, NaN or an infinity."""
    with pytest.raises(FrameError) as info:
        P.decode_header(P.pack({P.KIND: Kind.REQUEST, P.ID: "n", key: value}))
    assert info.value.reason == "bad_field"


def test_numbers_ints_are_accepted_where_floats_are_documented() -> None:
    """docs/PROTOCOL.md §3: ``budget`` (ms) and ``deadline`` (Unix s) mean the same as an int or a
    float; ``retry_after`` of an error map likewise; a daemon's timers are floats even when they
    were configured as integers, so the ``register`` answer always carries float64 seconds."""
    as_int = P.decode_header(P.pack({P.KIND: Kind.REQUEST, P.BUDGET: 60_000}))
    as_float = P.decode_header(P.pack({P.KIND: Kind.REQUEST, P.BUDGET: 60_000.0}))
    assert as_int.deadline is not None and as_float.deadline is not None
    assert abs(as_int.deadline - as_float.deadline) < 1.0  # both about 60 s from now
    assert 59.0 < as_int.deadline - time.monotonic() <= 60.0
    wall = int(time.time()) + 30
    legacy_int = P.decode_header(P.pack({P.KIND: Kind.REQUEST, P.DEADLINE: wall}))
    legacy_float = P.decode_header(P.pack({P.KIND: Kind.REQUEST, P.DEADLINE: float(wall)}))
    assert legacy_int.deadline is not None and legacy_float.deadline is not None
    assert abs(legacy_int.deadline - legacy_float.deadline) < 1.0
    for hops in (0, 5, P.MAX_HOPS):
        assert P.decode_header(P.pack({P.KIND: Kind.REQUEST, P.HOPS: hops})).hops == hops
    assert error_from_wire({"code": "INBOX_FULL", "message": "m", "retry_after": 2}).retry_after == 2.0
    assert isinstance(error_from_wire({"code": "X", "retry_after": 2}).retry_after, float)

    from meshd.config.settings import Settings
    timers = Settings(heartbeat_interval=2, stale_after=6, offline_after=20)
    assert all(type(t) is float
               for t in (timers.heartbeat_interval, timers.stale_after, timers.offline_after))
    assert msgpack.packb(timers.heartbeat_interval)[:1] == b"\xcb"  # float64 on the wire, as §15.1 shows


def test_register_answer_example_matches_the_defaults() -> None:
    """docs/PROTOCOL.md §15.1: the hex dump of the ``register`` answer is the default settings'."""
    import re
    from pathlib import Path

    from meshd.config.settings import Settings

    doc = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md").read_text()
    section = doc[doc.index("### 15.1 Register"):doc.index("### 15.2")]
    dump = section[section.index("frame 2  body (§8.2)"):]
    dump = dump[:dump.index("```")]
    raw = bytes.fromhex(" ".join(re.findall(r"^  ((?:[0-9a-f]{2} ?)+)$", dump, re.M)))
    answer = msgpack.unpackb(raw)
    s = Settings()
    assert answer == {
        "node": "9c1e44a07b3f8d26", "node_name": "host-a", "mesh": "default",
        "heartbeat_interval": s.heartbeat_interval, "stale_after": s.stale_after,
        "offline_after": s.offline_after, "inbox_cap": s.inbox_cap, "max_payload_bytes": s.max_payload_bytes,
        "max_header_bytes": P.MAX_HEADER_BYTES, "max_batch": P.MAX_BATCH, "hop_limit": s.hop_limit,
        "in_flight_max": s.agent_answer_backlog}
    assert f"{len(raw)} bytes" in section
