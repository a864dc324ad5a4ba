"""Malformed input from a local agent is answered, counted and logged once per cause,
on a real daemon through a raw DEALER (the client library never sends these).

Before: a ``kind`` that is a list or a map raised TypeError (unhashable) and a name or query
nested 1,000 deep raised RecursionError while the error message was built: no answer (the sender
waited), nothing counted, one traceback per message."""

from __future__ import annotations

from typing import Any

import msgpack
import zmq

from meshd.testing import MeshdFactory
from meshd.wire import protocol as P


def _answers(raw: zmq.Socket[Any]) -> dict[str, Any]:
    while True:
        assert raw.poll(5000), "the daemon did not answer"
        _, hdr, _ = raw.recv_multipart()
        header: dict[str, Any] = msgpack.unpackb(hdr)
        if header["kind"] != "ping":
            return header


def _nested(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def test_malformed_kinds_and_deep_nesting_are_answered_and_counted(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    ctx: zmq.Context[Any] = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"ipc://{a.socket}")
    deep = _nested(1000)
    cases: list[tuple[str, dict[str, Any], Any]] = [
        ("kind-list", {"kind": ["send"], "from": "h", "to": "h"}, None),
        ("kind-map", {"kind": {"a": 1}, "from": "h", "to": "h"}, None),
        ("deep-register", {"kind": "register"}, {"name": deep}),
        ("deep-query", {"kind": "query", "what": deep}, None),
    ]
    try:
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r"}),
                            msgpack.packb({"name": "hostile"})])
        assert _answers(raw)["kind"] == "ok"
        for _round in range(3):  # repeated: still answered each time, logged once
            for msg_id, header, body in cases:
                header = {**header, "id": msg_id}
                raw.send_multipart([P.SIGNATURE, msgpack.packb(header),
                                    msgpack.packb(body) if body is not None else b""])
                answer = _answers(raw)
                assert answer["kind"] == "error" and answer["corr"] == msg_id, (msg_id, answer)
                assert answer["error"]["code"] == "VALIDATION_FAILED", (msg_id, answer)
        # the daemon goes on serving the same connection
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "query", "id": "q", "what": "node"}), b""])
        assert _answers(raw)["kind"] == "ok"
    finally:
        raw.close(0)
        ctx.term()
    stats = a.query("node")["stats"]
    counted = (stats.get("malformed", 0) + stats.get("agent_input_errors", 0)
               + stats.get("refused_control", 0))
    print(f"malformed answered=12 counted={counted} stats="
          f"{ {k: v for k, v in stats.items() if 'malformed' in k or 'input' in k} }")
    assert counted >= 12, stats
    log = a.log()
    assert "Traceback" not in log
    assert log.count("RecursionError") <= 2  # once per cause (register, query), not per message


def test_a_bad_qos1_batch_never_stops_qos1_retries(meshd_factory: MeshdFactory) -> None:
    """A qos-1 batch whose inner header is ``{kind: {}}`` once entered the
    outbox, and its give-up raised TypeError that ended the qos-1 retry task silently: later
    qos-1 sends were never retried. Now the give-up reports UNDELIVERABLE, and a later qos-1 send
    to an agent that registers afterwards is retried and delivered."""
    import asyncio

    from meshd import Agent
    from meshd.testing import async_wait_until

    a = meshd_factory.spawn("a", env={"MESHD_QOS1_TTL": "1", "MESHD_QOS1_ACK_TIMEOUT": "0.3"})
    ctx: zmq.Context[Any] = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"ipc://{a.socket}")
    try:
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r"}),
                            msgpack.packb({"name": "sender"})])
        assert _answers(raw)["kind"] == "ok"
        body = msgpack.packb([[{"kind": {}, "id": "i1"}, b"x"], [{"kind": "send", "id": "i2"}, b"y"]])
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "batch", "id": "b1", "from": "sender",
                                                        "to": "ghost", "qos": 1, "count": 2,
                                                        "kinds": ["send"]}), body])
        first = _answers(raw)
        # A qos-1 batch declared as sends is not decoded at the edge (docs/PROTOCOL.md §4.2, `kinds`;
        # one without `kinds` would be, and refused: the previous revision's form, §4.4): it is
        # stored ("ok"), and gives up after qos1_ttl; that give-up once raised TypeError and ended
        # the retry task. Wait for it before the next send, so a dead task would show.
        assert first["kind"] == "ok" and first["corr"] == "b1", first
        undeliverable = _answers(raw)
        assert undeliverable["kind"] == "error" and undeliverable["error"]["code"] == "UNDELIVERABLE"
        assert undeliverable.get("ids") == [None, "i2"] or undeliverable["corr"] == "b1", undeliverable

        # a well-formed qos-1 send to an agent that is not there yet: it must be retried
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "send", "id": "later-1", "from": "sender",
                                                        "to": "late", "topic": "t", "qos": 1}),
                            msgpack.packb("hello")])
        confirmed = _answers(raw)
        assert confirmed["kind"] == "ok" and confirmed["corr"] == "later-1", confirmed  # on disk

        async def receive() -> list[Any]:
            got: list[Any] = []
            async with Agent("late", socket=a.socket) as late:
                late.on("t")(lambda m: got.append(m.payload))
                await async_wait_until(lambda: got, timeout=10, what="the qos-1 retry to deliver")
            return got

        assert asyncio.run(receive()) == ["hello"]
    finally:
        raw.close(0)
        ctx.term()
    assert "Traceback" not in a.log()


def test_control_frame_count_enforced_and_register_tells_the_limits(meshd_factory: MeshdFactory) -> None:
    """A 10,000-frame ``register`` was accepted (§4.1 was enforced for data
    kinds only); and ``register``'s answer now tells a client the timers and limits it must
    respect, so a client written from docs/PROTOCOL.md alone need not guess them."""
    a = meshd_factory.spawn("a")
    ctx: zmq.Context[Any] = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"ipc://{a.socket}")
    try:
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "many"}),
                            msgpack.packb({"name": "frames"}), *([b""] * 9_998)])
        refused = _answers(raw)
        assert refused["kind"] == "error" and refused["corr"] == "many", refused
        assert refused["error"]["code"] == "VALIDATION_FAILED"
        assert "exactly 3 frames" in refused["error"]["message"]
        assert "frames" not in {x["name"] for x in a.query("agents")}

        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r"}),
                            msgpack.packb({"name": "frames"})])
        while True:
            assert raw.poll(5000)
            _, hdr, body = raw.recv_multipart()
            if msgpack.unpackb(hdr)["kind"] == "ok":
                break
        info = msgpack.unpackb(body)
        assert info["heartbeat_interval"] == 0.25 and info["stale_after"] == 1 and info["offline_after"] == 2
        assert info["inbox_cap"] == 100 and info["max_payload_bytes"] == 1048576
        assert info["max_header_bytes"] == P.MAX_HEADER_BYTES and info["max_batch"] == P.MAX_BATCH
        assert info["hop_limit"] == 5 and info["node"] == a.node_id
    finally:
        raw.close(0)
        ctx.term()
