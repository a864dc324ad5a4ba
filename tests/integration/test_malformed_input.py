"""Malformed input from a local agent is answered, counted and logged once per cause (issue 8,
item 20), on a real daemon through a raw DEALER (the client library never sends these).

Before: a ``kind`` that is a list or a map raised TypeError (unhashable) and a name or query
nested 1,000 deep raised RecursionError while the error message was built: no answer (the sender
waited), nothing counted, one traceback per message."""

from __future__ import annotations

from typing import Any

import msgpack
import zmq

from meshd import protocol as P
from meshd.testing import MeshdFactory


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
