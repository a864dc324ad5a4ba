"""Helper roles for the systems meshd is compared with: NATS (nats-py), Zenoh (peer mode), raw pyzmq PUB/SUB.

Same event protocol as roles.py (``ready``, ``go``, ``sent``, ``expect``, ``result``, ``stop``),
same payload (common.make_payload, msgpack-encoded per message by the sender and decoded per
message by the receiver), each written the way that system's documentation shows: an ``async def``
callback and a plain ``await nc.publish(...)`` loop for nats-py, a callback and a plain
``publisher.put(...)`` loop for Zenoh. One addition: senders here do a *warm-up* first (a warm
message every 20 ms until the orchestrator says ``go``) and each receiver reports ``warmed`` on its
first warm message, because neither NATS nor Zenoh nor PUB/SUB tells a publisher who subscribed.

Safety: NATS clients connect to the bench's own nats-server on 127.0.0.1; every Zenoh session
listens on tcp/127.0.0.1 only, connects to 127.0.0.1 endpoints only, and has multicast and gossip
scouting off, so nothing here reaches a real interface. This module never imports meshd.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import zmq
from common import LOOPBACK, make_payload
from roles import (
    Cfg,
    Tail,
    Tally,
    emit,
    emit_latency,
    pack,
    read_cmd,
    serve,
    timed,
    unpack,
    wait_cmd,
    wait_cmd_async,
    zsocket,
)

WARM_EVERY_S = 0.02
WARM = pack({"warm": 1})
_emit_lock = threading.Lock()


def emit_safe(obj: dict[str, Any]) -> None:
    """emit() from any thread (Zenoh calls back on its own threads)."""
    with _emit_lock:
        emit(obj)


def stdin_ready(timeout_s: float) -> bool:
    poller = zmq.Poller()
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


class Receiver:
    """What every receiver here does per message: decode, count, report the first warm-up."""

    def __init__(self) -> None:
        self.tally = Tally()
        self.warmed = False
        self.unpackb = msgpack.unpackb

    def on_data(self, data: bytes) -> None:
        p = self.unpackb(data, raw=False)
        if "warm" in p:
            if not self.warmed:
                self.warmed = True
                emit_safe({"event": "warmed"})
            return
        self.tally.add(1)

    def wait_tail_sync(self) -> None:
        """Block (main thread) for ``expect``, then until the tail is done; emit the result."""
        tail = Tail()
        tail.expect(wait_cmd())
        while not tail.done(self.tally.count):
            time.sleep(0.01)
        emit_safe({"event": "result", **self.tally.result()})

    async def wait_tail(self) -> None:
        tail = Tail()
        tail.expect(await wait_cmd_async())
        while not tail.done(self.tally.count):  # noqa: ASYNC110 (bounded: Tail gives up)
            await asyncio.sleep(0.01)
        emit({"event": "result", **self.tally.result()})


def paced_report(i: int, t0: float, errors: int = 0) -> dict[str, Any]:
    elapsed = time.perf_counter() - t0
    return {"sent": i, "elapsed_s": elapsed, "rate": i / elapsed, "errors": errors}


# ============================================================================================ NATS

async def _nats(cfg: Cfg) -> Any:
    import nats

    return await nats.connect(cfg["url"], allow_reconnect=False, connect_timeout=5)


async def nats_recv(cfg: Cfg) -> None:
    """A subscriber with an ``async def`` callback (nats-py's documented form)."""
    rx = Receiver()
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(type(exc).__name__)

    import nats

    nc = await nats.connect(cfg["url"], allow_reconnect=False, connect_timeout=5, error_cb=on_error)

    async def handler(msg: Any) -> None:
        rx.on_data(msg.data)

    await nc.subscribe(cfg["subject"], cb=handler)
    await nc.flush()
    emit({"event": "ready"})
    await rx.wait_tail()
    await nc.close()


async def _warm_until_go(send_warm: Callable[[], Any]) -> None:
    """Send a warm message every WARM_EVERY_S until the orchestrator's ``go`` arrives."""
    cmd = asyncio.ensure_future(wait_cmd_async())
    while not cmd.done():
        await send_warm()
        await asyncio.wait({cmd}, timeout=WARM_EVERY_S)
    cmd.result()


async def nats_send(cfg: Cfg) -> None:
    """A plain ``await nc.publish(subject, data)`` loop, bounded in count and time."""
    nc = await _nats(cfg)
    subject = cfg["subject"]
    publish = nc.publish
    emit({"event": "ready"})
    await _warm_until_go(lambda: publish(subject, WARM))
    max_n = int(cfg["max_n"])
    packb = msgpack.packb
    deadline = time.perf_counter() + float(cfg["duration"])
    t0 = time.perf_counter()
    i = 0
    while i < max_n:
        await publish(subject, packb(make_payload(i), use_bin_type=True))
        i += 1
        if not i & 1023 and time.perf_counter() > deadline:
            break
    await nc.flush(timeout=30)
    emit({"event": "sent", **paced_report(i, t0)})
    await wait_cmd_async()
    await nc.close()
    emit({"event": "result", **paced_report(i, t0)})


async def nats_echo(cfg: Cfg) -> None:
    nc = await _nats(cfg)

    async def handler(msg: Any) -> None:
        await msg.respond(pack(unpack(msg.data)))

    await nc.subscribe(cfg["subject"], cb=handler)
    await nc.flush()
    emit({"event": "ready"})
    await wait_cmd_async()
    await nc.close()
    emit({"event": "result"})


async def nats_rtt(cfg: Cfg) -> None:
    """A plain awaited ``nc.request`` loop (the echo decodes and re-encodes)."""
    nc = await _nats(cfg)
    subject = cfg["subject"]
    emit({"event": "ready"})
    await wait_cmd_async()
    samples: list[int] = []
    for i in timed(cfg, samples):
        msg = await nc.request(subject, pack(make_payload(i)), timeout=5)
        unpack(msg.data)
    await nc.close()
    emit_latency(samples)



# =========================================================================================== Zenoh

def zenoh_session(cfg: Cfg) -> Any:
    """A Zenoh session in peer mode: listens on its own 127.0.0.1 port, connects to the listed
    127.0.0.1 endpoints, with multicast and gossip scouting off (nothing leaves loopback)."""
    import zenoh

    listen = [f"tcp/{LOOPBACK}:{int(cfg['port'])}"]
    connect = [f"tcp/{LOOPBACK}:{int(p)}" for p in cfg.get("connect_ports", [])]
    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps("peer"))
    conf.insert_json5("listen/endpoints", json.dumps(listen))
    conf.insert_json5("connect/endpoints", json.dumps(connect))
    conf.insert_json5("scouting/multicast/enabled", "false")
    conf.insert_json5("scouting/gossip/enabled", "false")
    return zenoh.open(conf)


def zenoh_recv(cfg: Cfg) -> None:
    """A subscriber with a callback (Zenoh calls it on its own thread)."""
    rx = Receiver()
    session = zenoh_session(cfg)
    session.declare_subscriber(cfg["key"], lambda sample: rx.on_data(sample.payload.to_bytes()))
    emit_safe({"event": "ready"})
    try:
        rx.wait_tail_sync()
    finally:
        session.close()


def zenoh_send(cfg: Cfg) -> None:
    """A plain ``publisher.put(data)`` loop; congestion control BLOCK, so nothing is dropped."""
    import zenoh

    session = zenoh_session(cfg)
    pub = session.declare_publisher(cfg["key"], congestion_control=zenoh.CongestionControl.BLOCK)
    put = pub.put
    emit_safe({"event": "ready"})
    while not stdin_ready(WARM_EVERY_S):
        put(WARM)
    read_cmd()  # go
    max_n = int(cfg["max_n"])
    packb = msgpack.packb
    deadline = time.perf_counter() + float(cfg["duration"])
    t0 = time.perf_counter()
    i = 0
    while i < max_n:
        put(packb(make_payload(i), use_bin_type=True))
        i += 1
        if not i & 1023 and time.perf_counter() > deadline:
            break
    emit_safe({"event": "sent", **paced_report(i, t0)})
    wait_cmd()
    session.close()
    emit_safe({"event": "result", **paced_report(i, t0)})


def zenoh_echo(cfg: Cfg) -> None:
    """A queryable that answers each query with the decoded and re-encoded payload."""
    session = zenoh_session(cfg)

    def answer(query: Any) -> None:
        query.reply(query.key_expr, pack(unpack(query.payload.to_bytes())))

    session.declare_queryable(cfg["key"], answer)
    emit_safe({"event": "ready"})
    try:
        wait_cmd()
    finally:
        session.close()
    emit_safe({"event": "result"})


def zenoh_rtt(cfg: Cfg) -> None:
    """A plain ``session.get(key, payload=...)`` loop, reading the one reply of each."""
    session = zenoh_session(cfg)
    key = cfg["key"]

    def ask(i: int) -> bool:
        for reply in session.get(key, payload=pack(make_payload(i)), timeout=5.0):
            if reply.ok is not None:
                unpack(reply.ok.payload.to_bytes())
                return True
        return False

    end = time.monotonic() + 15  # until the queryable is known to this session (bounded)
    while not ask(0) and time.monotonic() < end:
        time.sleep(0.02)
    emit_safe({"event": "ready"})
    wait_cmd()
    samples: list[int] = []
    for i in timed(cfg, samples):
        ask(i)
    session.close()
    emit_latency(samples)



# ========================================================================= raw pyzmq PUB/SUB (d)

def raw_pub(cfg: Cfg) -> None:
    """PUB bound on 127.0.0.1 (no high-water mark: a bounded run cannot grow without limit)."""
    sock = zsocket(zmq.PUB, linger=5000, SNDHWM=0)
    port = sock.bind_to_random_port(f"tcp://{LOOPBACK}")
    emit({"event": "ready", "endpoint": f"tcp://{LOOPBACK}:{port}"})
    while not stdin_ready(WARM_EVERY_S):
        sock.send(WARM)
    read_cmd()
    send = sock.send
    packb = msgpack.packb
    max_n = int(cfg["max_n"])
    deadline = time.perf_counter() + float(cfg["duration"])
    t0 = time.perf_counter()
    i = 0
    while i < max_n:
        send(packb(make_payload(i), use_bin_type=True))
        i += 1
        if not i & 1023 and time.perf_counter() > deadline:
            break
    emit({"event": "sent", **paced_report(i, t0)})
    wait_cmd()
    emit({"event": "result", **paced_report(i, t0)})


def raw_sub(cfg: Cfg) -> None:
    """SUB connected to the PUB: decodes every payload, counts (the endpoint comes with ``go``)."""
    sock = zsocket(zmq.SUB, RCVHWM=0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(cfg["endpoint"])
    rx = Receiver()
    tail = Tail()
    emit({"event": "ready"})

    def on_cmd() -> bool:
        tail.expect(read_cmd())
        return False

    serve({sock: lambda frames: rx.on_data(frames[0])}, on_stdin=on_cmd,
          done=lambda: tail.done(rx.tally.count))
    emit({"event": "result", **rx.tally.result()})



PEER_ROLES: dict[str, Callable[[Cfg], Any]] = {
    "nats_recv": nats_recv, "nats_send": nats_send, "nats_echo": nats_echo, "nats_rtt": nats_rtt,
    "zenoh_recv": zenoh_recv, "zenoh_send": zenoh_send, "zenoh_echo": zenoh_echo,
    "zenoh_rtt": zenoh_rtt,
    "raw_pub": raw_pub, "raw_sub": raw_sub,
}
