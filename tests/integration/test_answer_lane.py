"""Error notices and daemon answers have a lane the data inbox cap cannot
silence. A client that keeps at most ``in_flight_max`` calls outstanding (the register answer
says how many) gets every answer, even while it reads nothing. Real daemon, a raw client that
follows docs/PROTOCOL.md (the way a non-Python client would)."""

from __future__ import annotations

from typing import Any

import msgpack
import zmq

from meshd.testing import MeshdFactory, MeshdProcess
from meshd.wire import protocol as P


def _raw(ctx: zmq.Context[Any], proc: MeshdProcess, name: str) -> tuple[zmq.Socket[Any], dict[str, Any]]:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 10)
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(f"ipc://{proc.socket}")
    sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": f"r-{name}"}),
                         msgpack.packb({"name": name})])
    assert sock.poll(5000)
    frames = sock.recv_multipart()
    header = msgpack.unpackb(frames[1])
    assert header["kind"] == "ok", header
    return sock, msgpack.unpackb(frames[2]) if len(frames) > 2 and frames[2] else {}


def _drain(sock: zmq.Socket[Any], quiet_ms: int = 1500) -> list[dict[str, Any]]:
    """Everything the socket receives until it has been quiet for ``quiet_ms``."""
    got = []
    while sock.poll(quiet_ms):
        got.append(msgpack.unpackb(sock.recv_multipart()[1]))
    return got


def test_errors_and_answers_survive_a_full_inbox(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        stuck, _ = _raw(ctx, a, "stuck")
        flooder, welcome = _raw(ctx, a, "flooder")
        allowance = int(welcome.get("in_flight_max", 1000))
        assert welcome.get("inbox_cap") == 100
        n = allowance
        # n sends to an agent that never reads, without reading a thing: every one is delivered
        # or answered with an error.
        for i in range(n):
            header = {"kind": "send", "id": f"s{i}", "from": "flooder", "to": "stuck", "topic": "spam"}
            flooder.send_multipart([P.SIGNATURE, msgpack.packb(header), b"\xc0"])
        answers = _drain(flooder)
        delivered = _drain(stuck, 300)
        errors = {h.get("corr") for h in answers if h.get("kind") == "error"}
        # n back-to-back queries, again without reading: every one is answered
        for i in range(n):
            query = {"kind": "query", "id": f"q{i}", "what": "node"}
            flooder.send_multipart([P.SIGNATURE, msgpack.packb(query), b""])
        answered = {h.get("corr") for h in _drain(flooder) if h.get("kind") == "ok"}
        print(f"answer lane: allowance={n}: sends delivered={len(delivered)} errors={len(errors)} "
              f"silent={n - len(delivered) - len(errors)}; queries answered={len(answered)}/{n}")
        assert len(errors) + len(delivered) == n
        assert answered == {f"q{i}" for i in range(n)}
    finally:
        ctx.destroy(0)
