"""meshd benchmark: the daemon path measured side by side with raw pyzmq, in one run.

    .venv/bin/python bench/bench.py [--quick] [--json out.json]

Scenarios (see bench/README.md):
  (a) raw pyzmq DEALER->ROUTER over tcp 127.0.0.1: one-way msgs/s, and request/reply p50/p99
  (b) meshd one way: Agent -> daemon A -> daemon B -> Agent
  (c) meshd request/reply round trip through two daemons
  (d) meshd publish to 4 subscribers on the other daemon
  (e) as (b), but the sender is a raw DEALER sending pre-encoded batches in the local protocol
  (f) as (e), and the receiver is a raw DEALER too (daemons only, both ends raw; informational)
  (g) as (b) with send(..., qos=1), windows of sends in flight: qos 1 / qos 0, losses, commits
  (h) (b) and (c) again between two daemons with CurveZMQ on: CURVE / plaintext
  discovery of a newly started daemon (both ways) and staleness of a SIGKILLed one.

Every process is a separate OS process (2 daemons, 2 more with CURVE for (h), + helper processes
that this file runs with ``--role``). Helpers talk to the orchestrator with JSON lines on
stdin/stdout. Every daemon binds 127.0.0.1 only, in a mesh named uniquely for this run; every
loop is bounded in count and time; every process started here is killed (by PID) in a finally
block.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import queue
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import zmq

if TYPE_CHECKING:
    from meshd.client import Agent

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

LOOPBACK = "127.0.0.1"
HELPER_HARD_TIMEOUT = 90.0  # every helper exits by itself after this, whatever happens
TAIL_IDLE_S = 2.0  # after the sender is done, a receiver gives up when nothing arrived for this long
TAIL_CAP_S = 30.0  # ... and in any case after this long (late messages are not lost messages)
BODY = "x" * 252  # makes the encoded payload ~300 bytes
QOS1_WINDOW = 512  # (g): qos-1 sends in flight at once (one asyncio.gather per window) ...
QOS1_LANES = 2  # ... in this many concurrent lanes (so 1024 in flight)


_PID = f"{os.getpid():x}"


def make_payload(i: int) -> dict[str, Any]:
    """The benchmark payload: a map with a fresh id and timestamp per message (~300 bytes packed)."""
    return {"id": f"{_PID}-{i:x}", "ts": time.time(), "seq": i, "body": BODY}


def payload_size() -> int:
    return len(msgpack.packb(make_payload(123456), use_bin_type=True))


# ===================================================================================== helpers
# Each helper prints {"event": "ready", ...}, follows commands read from stdin as JSON lines,
# prints {"event": "result", ...} and exits. A closed stdin (orchestrator gone) stops it.


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read_cmd_blocking(timeout: float) -> dict[str, Any]:
    """Read one JSON command from stdin, at most ``timeout`` s (zmq.Poller watches the fd)."""
    poller = zmq.Poller()
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    if not poller.poll(int(timeout * 1000)):
        raise TimeoutError("no command from the orchestrator")
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(3)
    return dict(json.loads(line))


async def read_cmd_async(timeout: float = HELPER_HARD_TIMEOUT) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    line = await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), timeout)
    if not line:
        raise SystemExit(3)
    return dict(json.loads(line))


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    s = sorted(samples_ns)
    n = len(s)

    def pct(p: float) -> float:
        return s[min(n - 1, round(p / 100 * (n - 1)))] / 1000.0

    return {"n": n, "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99),
            "mean_us": statistics.fmean(s) / 1000.0, "max_us": s[-1] / 1000.0}


# ---------------------------------------------------------------- raw pyzmq helpers (scenario a)

def role_raw_sink(cfg: dict[str, Any]) -> None:
    """ROUTER bound on 127.0.0.1; decodes every payload; counts."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port(f"tcp://{LOOPBACK}")
    emit({"event": "ready", "endpoint": f"tcp://{LOOPBACK}:{port}"})
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    unpackb = msgpack.unpackb
    count = 0
    first = last = 0.0
    expected: int | None = None
    hard = time.monotonic() + HELPER_HARD_TIMEOUT
    cap_deadline = hard
    idle = 2.0
    progress_at = time.monotonic()  # last time the count moved (or the "expect" command came)
    while time.monotonic() < min(hard, cap_deadline):
        if expected is not None and (count >= expected or time.monotonic() - progress_at > idle):
            break
        before = count
        for s, _ in poller.poll(100):
            if s is sock:
                for _ in range(4096):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    unpackb(frames[1], raw=False)
                    last = time.perf_counter()
                    if not count:
                        first = last
                    count += 1
            else:
                line = sys.stdin.readline()
                if not line:
                    raise SystemExit(3)
                cmd = json.loads(line)
                expected = int(cmd["n"])
                idle = float(cmd.get("idle", 2.0))
                cap_deadline = time.monotonic() + float(cmd.get("cap", 30.0))
                progress_at = time.monotonic()
        if count != before:
            progress_at = time.monotonic()
    span = last - first
    emit({"event": "result", "received": count, "span_s": span,
          "rate": (count - 1) / span if span > 0 and count > 1 else 0.0})
    sock.close(0)
    ctx.term()


def role_raw_source(cfg: dict[str, Any]) -> None:
    """DEALER connected to the sink; msgpack-encodes a fresh payload per message."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.setsockopt(zmq.SNDTIMEO, 5000)  # a stuck receiver ends the run instead of hanging it
    sock.connect(cfg["endpoint"])
    emit({"event": "ready"})
    read_cmd_blocking(HELPER_HARD_TIMEOUT)
    packb = msgpack.packb
    send = sock.send
    max_n = int(cfg["max_n"])
    deadline = time.perf_counter() + float(cfg["duration"])
    t0 = time.perf_counter()
    i = 0
    try:
        while i < max_n:
            send(packb(make_payload(i), use_bin_type=True))
            i += 1
            if not i & 1023 and time.perf_counter() > deadline:
                break
    except zmq.Again:
        pass
    elapsed = time.perf_counter() - t0
    emit({"event": "result", "sent": i, "elapsed_s": elapsed, "rate": i / elapsed, "errors": 0})
    sock.close()  # linger: what is queued still goes out
    ctx.term()


def role_raw_echo(cfg: dict[str, Any]) -> None:
    """ROUTER that decodes each request and answers with the re-encoded payload."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port(f"tcp://{LOOPBACK}")
    emit({"event": "ready", "endpoint": f"tcp://{LOOPBACK}:{port}"})
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    hard = time.monotonic() + HELPER_HARD_TIMEOUT
    answered = 0
    while time.monotonic() < hard:
        events = dict(poller.poll(100))
        if sock in events:
            while True:
                try:
                    rid, data = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                obj = msgpack.unpackb(data, raw=False)
                sock.send_multipart([rid, msgpack.packb(obj, use_bin_type=True)])
                answered += 1
        if sys.stdin.fileno() in events:
            break  # "stop" or EOF
    emit({"event": "result", "answered": answered})
    sock.close(0)
    ctx.term()


def role_raw_echo_dealer(cfg: dict[str, Any]) -> None:
    """DEALER connected to a relay: decodes each request and sends the re-encoded payload back."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(cfg["endpoint"])
    sock.send(b"hello")  # the relay learns our routing id from the first message
    emit({"event": "ready"})
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    hard = time.monotonic() + HELPER_HARD_TIMEOUT
    while time.monotonic() < hard:
        events = dict(poller.poll(100))
        if sock in events:
            while True:
                try:
                    data = sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                sock.send(msgpack.packb(msgpack.unpackb(data, raw=False), use_bin_type=True))
        if sys.stdin.fileno() in events:
            break
    emit({"event": "result"})
    sock.close(0)
    ctx.term()


def role_raw_rtt(cfg: dict[str, Any]) -> None:
    """DEALER that sends sequential requests (encode, send, recv, decode) and times each."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    sock.connect(cfg["endpoint"])
    emit({"event": "ready"})
    read_cmd_blocking(HELPER_HARD_TIMEOUT)
    samples: list[int] = []
    deadline = time.monotonic() + float(cfg["max_time"])
    warm = int(cfg["warmup"])
    try:
        for i in range(warm + int(cfg["n"])):
            t = time.perf_counter_ns()
            sock.send(msgpack.packb(make_payload(i), use_bin_type=True))
            msgpack.unpackb(sock.recv(), raw=False)
            if i >= warm:
                samples.append(time.perf_counter_ns() - t)
            if time.monotonic() > deadline:
                break
    except zmq.Again:
        pass
    emit({"event": "result", **percentiles(samples or [0])})
    sock.close(0)
    ctx.term()


# ---------------------------------------------------------------- meshd Agent helpers (b, c, d)

def _agent(cfg: dict[str, Any]) -> Agent:
    from meshd.client import Agent

    return Agent(cfg["name"], socket=cfg["socket"])


async def _wait_known(me: Any, name: str, timeout: float = 15.0) -> None:
    """Wait until the local daemon's directory lists ``name`` (learned from the other daemon)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(a.get("name") == name for a in await me.agents()):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"agent {name!r} never appeared in the directory")


async def _mesh_counter(cfg: dict[str, Any]) -> None:
    """An Agent that counts the payloads it receives on a topic (direct or subscribed)."""
    state = {"count": 0, "first": 0.0, "last": 0.0, "warm": 0, "dups": 0}
    dedupe = bool(cfg.get("dedupe"))  # qos 1 is at least once: count each seq once
    seen_seqs: set[int] = set()
    async with _agent(cfg) as me:
        topic = cfg["topic"]

        @me.on(topic)
        def on_msg(msg: Any) -> None:
            if msg.payload.get("warm"):
                state["warm"] += 1
                return
            if dedupe:
                seq = msg.payload["seq"]
                if seq in seen_seqs:
                    state["dups"] += 1
                    return
                seen_seqs.add(seq)
            t = time.perf_counter()
            if not state["count"]:
                state["first"] = t
            state["last"] = t
            state["count"] += 1

        if cfg.get("subscribe"):
            await me.subscribe(topic)
        emit({"event": "ready"})
        cmd = await read_cmd_async()
        expected = int(cmd["n"])
        # Wait for the tail: until everything arrived, nothing arrived for `idle` s, or `cap` s.
        end = time.monotonic() + float(cmd.get("cap", 30.0))
        idle = float(cmd.get("idle", 2.0))
        seen, progress_at = state["count"], time.monotonic()
        while state["count"] < expected and time.monotonic() < end:
            if state["count"] != seen:
                seen, progress_at = state["count"], time.monotonic()
            elif time.monotonic() - progress_at > idle:
                break
            await asyncio.sleep(0.01)
        span = state["last"] - state["first"]
        emit({"event": "result", "received": state["count"], "span_s": span, "warm": state["warm"],
              "dups": state["dups"],
              "rate": (state["count"] - 1) / span if span > 0 and state["count"] > 1 else 0.0,
              "errors": me.errors_received})


def role_mesh_recv(cfg: dict[str, Any]) -> None:
    asyncio.run(asyncio.wait_for(_mesh_counter(cfg), HELPER_HARD_TIMEOUT))


async def _mesh_send(cfg: dict[str, Any]) -> None:
    errors: dict[str, int] = {}

    def on_error(err: Any, corr: Any) -> None:
        errors[err.code] = errors.get(err.code, 0) + 1

    async with _agent(cfg) as me:
        me.on_error = on_error
        await _wait_known(me, cfg["to"])
        emit({"event": "ready"})
        await read_cmd_async()
        to = cfg["to"]
        send = me.send
        max_n = int(cfg["max_n"])
        qos = int(cfg.get("qos", 0))
        window = int(cfg.get("window", 512))
        failed = 0  # qos 1: sends that raised (not confirmed durable by the daemon)
        deadline = time.perf_counter() + float(cfg["duration"])
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        i = 0
        if qos == 0:
            while i < max_n:
                await send(to, "bench", make_payload(i))
                i += 1
                if not i & 1023 and time.perf_counter() > deadline:
                    break
        else:
            # qos 1: each send returns once daemon A has the message on disk. Each lane keeps a
            # window of them in flight (one gather per window), so the client batches them and
            # the daemon commits many per fsync; with 2 lanes one window is being built while
            # the other waits for its confirmations.
            async def lane() -> None:
                nonlocal i, failed
                while i < max_n and time.perf_counter() < deadline:
                    k = min(window, max_n - i)
                    base = i
                    i += k
                    results = await asyncio.gather(
                        *(send(to, "bench", make_payload(base + j), qos=1) for j in range(k)),
                        return_exceptions=True)
                    for res in results:
                        if isinstance(res, BaseException):
                            failed += 1
                            code = getattr(res, "code", type(res).__name__)
                            errors[f"send:{code}"] = errors.get(f"send:{code}", 0) + 1

            await asyncio.gather(*(lane() for _ in range(int(cfg.get("lanes", 1)))))
        i -= failed  # confirmed sends only: the receiver must get exactly these
        elapsed = time.perf_counter() - t0
        cpu_us = (time.process_time() - cpu0) * 1e6 / max(i, 1)  # the sender's own CPU per message
        # Let the client's queue drain before we report (closing early would drop the tail).
        end = time.monotonic() + 10
        await asyncio.sleep(0)
        while (me._sendq or me._out) and time.monotonic() < end:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        drained = time.perf_counter() - t0
        emit({"event": "sent", "sent": i, "elapsed_s": elapsed, "rate": i / elapsed,
              "drained_s": drained, "cpu_us_per_msg": cpu_us})
        await read_cmd_async()  # "stop": receivers are done, bounces (if any) have arrived
        emit({"event": "result", "sent": i, "elapsed_s": elapsed, "rate": i / elapsed,
              "errors": sum(errors.values()), "error_codes": errors, "send_failed": failed})


def role_mesh_send(cfg: dict[str, Any]) -> None:
    asyncio.run(asyncio.wait_for(_mesh_send(cfg), HELPER_HARD_TIMEOUT))


async def _mesh_echo(cfg: dict[str, Any]) -> None:
    async with _agent(cfg) as me:
        @me.on("rr")
        def echo(msg: Any) -> Any:
            return msg.payload

        emit({"event": "ready"})
        await read_cmd_async()
        emit({"event": "result"})


def role_mesh_echo(cfg: dict[str, Any]) -> None:
    asyncio.run(asyncio.wait_for(_mesh_echo(cfg), HELPER_HARD_TIMEOUT))


async def _mesh_rtt(cfg: dict[str, Any]) -> None:
    async with _agent(cfg) as me:
        await _wait_known(me, cfg["to"])
        emit({"event": "ready"})
        await read_cmd_async()
        to = cfg["to"]
        samples: list[int] = []
        warm = int(cfg["warmup"])
        deadline = time.monotonic() + float(cfg["max_time"])
        for i in range(warm + int(cfg["n"])):
            t = time.perf_counter_ns()
            await me.request(to, "rr", make_payload(i), timeout=5)
            if i >= warm:
                samples.append(time.perf_counter_ns() - t)
            if time.monotonic() > deadline:
                break
        emit({"event": "result", **percentiles(samples or [0])})


def role_mesh_rtt(cfg: dict[str, Any]) -> None:
    asyncio.run(asyncio.wait_for(_mesh_rtt(cfg), HELPER_HARD_TIMEOUT))


async def _mesh_pub(cfg: dict[str, Any]) -> None:
    topic = cfg["topic"]
    n_subs = int(cfg["subscribers"])
    async with _agent(cfg) as me:
        # Warm up until the publisher's daemon counts every subscriber and the SUB sockets have
        # had time to pass their subscriptions to its XPUB (counted separately by subscribers).
        end = time.monotonic() + 15
        reached = 0
        while time.monotonic() < end:
            reached = await me.publish(topic, {"warm": 1})
            if reached >= n_subs:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        for _ in range(20):
            await me.publish(topic, {"warm": 1})
        emit({"event": "ready", "reached": reached})
        await read_cmd_async()
        window = int(cfg["window"])
        max_n = int(cfg["max_n"])
        deadline = time.perf_counter() + float(cfg["duration"])
        t0 = time.perf_counter()
        i = 0
        counts: dict[int, int] = {}
        failures = 0
        while i < max_n and time.perf_counter() < deadline:
            k = min(window, max_n - i)
            results = await asyncio.gather(
                *(me.publish(topic, make_payload(i + j)) for j in range(k)), return_exceptions=True
            )
            for r in results:
                if isinstance(r, BaseException):
                    failures += 1
                else:
                    counts[r] = counts.get(r, 0) + 1
            i += k
        elapsed = time.perf_counter() - t0
        emit({"event": "sent", "sent": i, "elapsed_s": elapsed, "rate": i / elapsed,
              "reached_hist": {str(k): v for k, v in counts.items()}, "failures": failures})
        await read_cmd_async()
        emit({"event": "result", "sent": i, "errors": me.errors_received + failures})


def role_mesh_pub(cfg: dict[str, Any]) -> None:
    asyncio.run(asyncio.wait_for(_mesh_pub(cfg), HELPER_HARD_TIMEOUT))


# ---------------------------------------------------------------- raw local-protocol helpers (e, f)

SIG = b"MSH\x01"  # meshd.protocol.SIGNATURE (checked against the module at start-up)


def _wire_connect(cfg: dict[str, Any]) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    """A DEALER on the daemon's ipc socket, registered under cfg['name'] (REGISTER kind)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.setsockopt(zmq.RCVHWM, 10_000)
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    sock.connect(f"ipc://{cfg['socket']}")
    _wire_call(sock, {"kind": "register"}, {"name": cfg["name"], "capabilities": [], "metadata": {}})
    return ctx, sock


_wire_seq = iter(range(1, 1 << 62))


def _wire_call(sock: zmq.Socket[Any], header: dict[str, Any], body: Any = None) -> Any:
    """A daemon-addressed control call: send, wait (bounded) for the ok; returns its body."""
    return _wire_call_h(sock, header, body)[1]


def _wire_call_h(sock: zmq.Socket[Any], header: dict[str, Any],
                 body: Any = None) -> tuple[dict[str, Any], Any]:
    """As _wire_call, returning (ok header, decoded body)."""
    msg_id = f"w{os.getpid():x}-{next(_wire_seq)}"
    header = dict(header, id=msg_id)
    sock.send_multipart([SIG, msgpack.packb(header), msgpack.packb(body) if body is not None else b""])
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if not sock.poll(100):
            continue
        frames = sock.recv_multipart()
        h = msgpack.unpackb(frames[1], raw=False)
        if h.get("corr") != msg_id:
            continue
        if h.get("kind") == "error":
            raise RuntimeError(f"daemon refused {header['kind']}: {h.get('error')}")
        return h, (msgpack.unpackb(frames[2], raw=False) if frames[2] else None)
    raise TimeoutError(f"no answer to {header['kind']}")


def _wire_heartbeat(sock: zmq.Socket[Any]) -> None:
    with contextlib.suppress(zmq.Again):
        sock.send_multipart([SIG, msgpack.packb({"kind": "agent_hb"}), msgpack.packb({})], zmq.NOBLOCK)


def role_wire_send(cfg: dict[str, Any]) -> None:
    """Raw DEALER speaking the local protocol: pre-encoded batches [SIG, batch-hdr, body]."""
    ctx, sock = _wire_connect(cfg)
    to, me, batch = cfg.get("to"), cfg["name"], int(cfg["batch"])
    topic = cfg.get("topic")
    end = time.monotonic() + 15
    reached = 0
    while time.monotonic() < end:
        if topic is None:
            if any(a.get("name") == to for a in _wire_call(sock, {"kind": "query", "what": "agents"})):
                break
        else:  # publish mode: wait until the daemon counts every subscriber
            h, _ = _wire_call_h(sock, {"kind": "publish", "topic": topic, "from": me}, {"warm": 1})
            reached = int(h.get("count", 0))
            if reached >= int(cfg["subscribers"]):
                time.sleep(0.3)  # SUB subscriptions travel to the XPUB on their own
                for _ in range(20):
                    _wire_call_h(sock, {"kind": "publish", "topic": topic, "from": me}, {"warm": 1})
                break
        time.sleep(0.02)
    # Pre-encode 8 distinct batches (fresh ids and payloads inside each), then cycle through them.
    dest = {"to": to} if topic is None else {"topic": topic}
    inner = {"kind": "send", "topic": "bench"} if topic is None else {"kind": "publish"}
    batches = []
    for b in range(8):
        items = []
        for j in range(batch):
            i = b * batch + j
            items.append([{**inner, "id": f"m{i}"}, msgpack.packb(make_payload(i), use_bin_type=True)])
        # [SIG, batch header, body]: the body is one msgpack array of [header, payload] pairs
        frames = [SIG, msgpack.packb({"kind": "batch", "id": f"b{b}", "from": me, **dest, "count": batch}),
                  msgpack.packb(items, use_bin_type=True)]
        batches.append(frames)
    emit({"event": "ready", "reached": reached})
    read_cmd_blocking(HELPER_HARD_TIMEOUT)
    errors: dict[str, int] = {}
    acks: dict[int, int] = {}
    refused = [0]  # messages the daemon refused (INBOX_FULL): a well-behaved sender sends them again

    def drain_errors() -> None:
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            h = msgpack.unpackb(frames[1], raw=False)
            if h.get("kind") == "error":
                code = (h.get("error") or {}).get("code", "?")
                errors[code] = errors.get(code, 0) + 1
                if code == "INBOX_FULL":
                    refused[0] += len(h.get("ids") or [1])
                    time.sleep(0.001)  # back off, as the retry hint asks
            elif h.get("kind") == "ok" and "count" in h:
                acks[h["count"]] = acks.get(h["count"], 0) + 1

    max_batches = int(cfg["max_n"]) // batch
    deadline = time.perf_counter() + float(cfg["duration"])
    t0 = time.perf_counter()
    last_hb = time.monotonic()
    n = 0
    try:
        while n < max_batches:
            sock.send_multipart(batches[n & 7])
            n += 1
            if not n & 63:
                if time.perf_counter() > deadline:
                    break
                drain_errors()
                if time.monotonic() - last_hb > 0.5:
                    _wire_heartbeat(sock)
                    last_hb = time.monotonic()
    except zmq.Again:
        pass
    # Make up for what was refused (INBOX_FULL), as a real client would, within a bounded time.
    resent = 0
    hard_resend = time.monotonic() + 20
    while time.monotonic() < hard_resend:
        drain_errors()
        if refused[0] - resent < batch:
            time.sleep(0.02)
            drain_errors()
            if refused[0] - resent < batch:
                break
        try:
            sock.send_multipart(batches[n & 7], zmq.NOBLOCK)
        except zmq.Again:
            time.sleep(0.001)
            continue
        n += 1
        resent += batch
    elapsed = time.perf_counter() - t0
    sent = n * batch - refused[0]  # accepted by the daemon; the receiver must get exactly these
    emit({"event": "sent", "sent": sent, "elapsed_s": elapsed, "rate": sent / elapsed})
    # Wait for "stop", heartbeating and collecting any bounces meanwhile.
    poller = zmq.Poller()
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    hard = time.monotonic() + 30
    while time.monotonic() < hard and not poller.poll(200):
        drain_errors()
        _wire_heartbeat(sock)
    drain_errors()
    emit({"event": "result", "sent": sent, "elapsed_s": elapsed, "rate": sent / elapsed,
          "errors": sum(errors.values()), "error_codes": errors,
          "acks": {str(k): v for k, v in acks.items()}})
    sock.close()
    ctx.term()


def role_wire_recv(cfg: dict[str, Any]) -> None:
    """Raw DEALER registered as an agent: decodes each payload (like raw_sink), counts."""
    ctx, sock = _wire_connect(cfg)
    emit({"event": "ready"})
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    unpackb = msgpack.unpackb
    count = first_k = 0
    first = last = 0.0
    expected: int | None = None
    hard = time.monotonic() + HELPER_HARD_TIMEOUT
    cap_deadline = hard
    idle = 2.0
    progress_at = time.monotonic()
    last_hb = time.monotonic()
    while time.monotonic() < min(hard, cap_deadline):
        if expected is not None and (count >= expected or time.monotonic() - progress_at > idle):
            break
        before = count
        if time.monotonic() - last_hb > 0.5:
            _wire_heartbeat(sock)
            last_hb = time.monotonic()
        for s, _ in poller.poll(100):
            if s is sock:
                for _ in range(4096):
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    h = unpackb(frames[1], raw=False)
                    kind = h.get("kind")
                    if kind == "batch":
                        pairs = unpackb(frames[2], raw=False)
                        for _h, p in pairs:
                            unpackb(p, raw=False)
                        k = len(pairs)
                    elif kind == "send":
                        unpackb(frames[2], raw=False)
                        k = 1
                    else:
                        continue
                    last = time.perf_counter()
                    if not count:
                        first, first_k = last, k
                    count += k
            else:
                line = sys.stdin.readline()
                if not line:
                    raise SystemExit(3)
                cmd = json.loads(line)
                expected = int(cmd["n"])
                idle = float(cmd.get("idle", 2.0))
                cap_deadline = time.monotonic() + float(cmd.get("cap", 30.0))
                progress_at = time.monotonic()
        if count != before:
            progress_at = time.monotonic()
    span = last - first
    emit({"event": "result", "received": count, "span_s": span,
          "rate": (count - first_k) / span if span > 0 else 0.0})
    sock.close(0)
    ctx.term()


def role_wire_echo(cfg: dict[str, Any]) -> None:
    """Raw DEALER registered as an agent that answers each request with a reply (local protocol)."""
    ctx, sock = _wire_connect(cfg)
    me = cfg["name"]
    emit({"event": "ready"})
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    hard = time.monotonic() + HELPER_HARD_TIMEOUT
    last_hb = time.monotonic()
    answered = 0
    n = 0
    while time.monotonic() < hard:
        events = dict(poller.poll(100))
        if sock in events:
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                h = msgpack.unpackb(frames[1], raw=False)
                if h.get("kind") != "request":
                    continue
                obj = msgpack.unpackb(frames[2], raw=False)
                n += 1
                reply = {"kind": "reply", "id": f"r{n}", "corr": h["id"], "topic": h.get("topic"),
                         "from": me, "to": h["from"]}
                sock.send_multipart([SIG, msgpack.packb(reply), msgpack.packb(obj, use_bin_type=True)])
                answered += 1
        if sys.stdin.fileno() in events:
            break
        if time.monotonic() - last_hb > 0.5:
            _wire_heartbeat(sock)
            last_hb = time.monotonic()
    emit({"event": "result", "answered": answered})
    sock.close(0)
    ctx.term()


def role_wire_rtt(cfg: dict[str, Any]) -> None:
    """Raw DEALER requester in the local protocol: encode header+payload, send, wait for the reply."""
    ctx, sock = _wire_connect(cfg)
    to, me = cfg["to"], cfg["name"]
    end = time.monotonic() + 15
    while time.monotonic() < end:
        if any(a.get("name") == to for a in _wire_call(sock, {"kind": "query", "what": "agents"})):
            break
        time.sleep(0.02)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    emit({"event": "ready"})
    read_cmd_blocking(HELPER_HARD_TIMEOUT)
    samples: list[int] = []
    warm = int(cfg["warmup"])
    deadline = time.monotonic() + float(cfg["max_time"])
    last_hb = time.monotonic()
    try:
        for i in range(warm + int(cfg["n"])):
            t = time.perf_counter_ns()
            msg_id = f"q{i}"
            header = {"kind": "request", "id": msg_id, "topic": "rr", "from": me, "to": to,
                      "deadline": time.time() + 5}
            payload = msgpack.packb(make_payload(i), use_bin_type=True)
            sock.send_multipart([SIG, msgpack.packb(header), payload])
            while True:
                frames = sock.recv_multipart()
                h = msgpack.unpackb(frames[1], raw=False)
                if h.get("corr") == msg_id:
                    msgpack.unpackb(frames[2], raw=False)
                    break
            if i >= warm:
                samples.append(time.perf_counter_ns() - t)
            if time.monotonic() > deadline:
                break
            if time.monotonic() - last_hb > 0.5:
                _wire_heartbeat(sock)
                last_hb = time.monotonic()
    except zmq.Again:
        pass
    emit({"event": "result", **percentiles(samples or [0])})
    sock.close(0)
    ctx.term()


def role_raw_relay(cfg: dict[str, Any]) -> None:
    """A minimal pyzmq 'daemon' with meshd's socket layout, in a plain zmq.Poller loop.

    Local ROUTER on ipc (agents' DEALERs connect), mesh ROUTER on tcp 127.0.0.1 (the peer's
    DEALER connects), one DEALER to the peer's mesh ROUTER. Whatever the local agent sends goes to
    the peer; whatever the peer sends goes to the (single) local agent. No header decoding: this
    is the floor a Python daemon with this topology can reach on this machine.
    """
    ctx = zmq.Context()
    local = ctx.socket(zmq.ROUTER)
    local.setsockopt(zmq.LINGER, 0)
    local.bind(f"ipc://{cfg['ipc']}")
    mesh = ctx.socket(zmq.ROUTER)
    mesh.setsockopt(zmq.LINGER, 0)
    port = mesh.bind_to_random_port(f"tcp://{LOOPBACK}")
    emit({"event": "ready", "endpoint": f"tcp://{LOOPBACK}:{port}"})
    cmd = read_cmd_blocking(30)
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(cmd["peer"])
    poller = zmq.Poller()
    poller.register(local, zmq.POLLIN)
    poller.register(mesh, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    agent_rid = None
    hard = time.monotonic() + HELPER_HARD_TIMEOUT
    while time.monotonic() < hard:
        events = dict(poller.poll(100))
        if local in events:
            while True:
                try:
                    frames = local.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                agent_rid = frames[0]
                dealer.send_multipart(frames[1:])
        if mesh in events:
            while True:
                try:
                    frames = mesh.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if agent_rid is not None:
                    local.send_multipart([agent_rid, *frames[1:]])
        if sys.stdin.fileno() in events:
            break
    emit({"event": "result"})
    for sk in (local, mesh, dealer):
        sk.close(0)
    ctx.term()


ROLES = {
    "raw_sink": role_raw_sink, "raw_source": role_raw_source, "raw_echo": role_raw_echo,
    "raw_rtt": role_raw_rtt, "mesh_recv": role_mesh_recv, "mesh_send": role_mesh_send,
    "mesh_echo": role_mesh_echo, "mesh_rtt": role_mesh_rtt, "mesh_pub": role_mesh_pub,
    "wire_send": role_wire_send, "wire_recv": role_wire_recv, "wire_echo": role_wire_echo,
    "wire_rtt": role_wire_rtt, "raw_relay": role_raw_relay,
    "raw_echo_dealer": role_raw_echo_dealer,
}


# ===================================================================================== orchestrator

class Helper:
    """One helper process; JSON lines out (read by a thread), JSON lines in."""

    def __init__(self, role: str, cfg: dict[str, Any], logdir: Path, tag: str) -> None:
        self.role = role
        self.tag = tag
        self.log_path = logdir / f"{tag}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE), "--role", role, "--cfg", json.dumps(cfg)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, cwd=str(REPO),
            )
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: dict[str, dict[str, Any]] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            try:
                self.lines.put(json.loads(raw))
            except json.JSONDecodeError:
                continue
        self.lines.put(None)

    def wait(self, event: str, timeout: float) -> dict[str, Any]:
        """The helper's ``event`` message (remembered: asking twice returns the same one)."""
        if event in self.seen:
            return self.seen[event]
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.tag}: no {event!r} within {timeout:g} s\n{self.stderr()}")
            try:
                msg = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if msg is None:
                raise RuntimeError(f"{self.tag} exited before {event!r}:\n{self.stderr()}")
            self.seen[str(msg.get("event"))] = msg
            if msg.get("event") == event:
                return msg

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass

    def stderr(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except FileNotFoundError:
            return ""

    def finish(self, timeout: float = 5.0) -> None:
        """Close stdin (the helper's stop signal), wait, and kill it by PID if it lingers."""
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(d: Daemon) -> float:
    """User+system CPU seconds a daemon has used so far (from /proc; 0 if it is gone)."""
    if d.proc is None:
        return 0.0
    try:
        fields = Path(f"/proc/{d.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


class Daemon:
    """One ``meshd run`` subprocess bound to 127.0.0.1, with a pre-made node id.

    ``secure``: CurveZMQ on (no ``--insecure``); the caller creates the keypair and the
    authorized-keys folder in ``state_dir`` before ``start`` (see ``Bench.secure_pair``).
    """

    def __init__(self, name: str, mesh: str, workdir: Path, secure: bool = False) -> None:
        self.name = name
        self.dir = workdir / name
        self.state_dir = self.dir / "state"
        self.state_dir.mkdir(parents=True, mode=0o700)
        self.node_id = os.urandom(8).hex()
        (self.state_dir / "node_id").write_text(self.node_id + "\n")
        self.socket = self.dir / "s.sock"
        self.log_path = self.dir / "meshd.log"
        self.secure = secure
        self.cmd = [sys.executable, "-m", "meshd", "run", "--name", name, "--mesh", mesh,
                    "--interface", LOOPBACK, "--state-dir", str(self.state_dir),
                    "--socket", str(self.socket)] + ([] if secure else ["--insecure"])
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.spawned_at = time.monotonic()
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=str(REPO))

    def wait_ready(self, timeout: float = 15.0) -> float:
        end = time.monotonic() + timeout
        while not self.socket.exists():
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"meshd {self.name} exited {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > end:
                raise TimeoutError(f"meshd {self.name} not ready after {timeout:g} s:\n{self.log()}")
            time.sleep(0.005)
        return time.monotonic() - self.spawned_at

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def stop(self) -> None:
        """SIGTERM (clean shutdown), SIGKILL if it does not exit in time."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(8)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""


class Bench:
    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.duration = 1.5 if quick else 3.0
        self.reps = 1 if quick else 2
        self.rtt_n = 1000 if quick else 2000
        # Raw-wire senders outrun the daemons: what is queued sits in zmq buffers, so bound it.
        self.wire_max_n = 1_000_000
        self.workdir = Path(tempfile.mkdtemp(prefix="mshb-", dir="/tmp"))
        self.logdir = self.workdir / "logs"
        self.logdir.mkdir()
        self.mesh = f"bench{uuid.uuid4().hex[:10]}"
        self.daemons: list[Daemon] = []
        self.helpers: list[Helper] = []
        self.results: dict[str, Any] = {}
        self._n = 0

    # ----------------------------------------------------------------- process bookkeeping

    def helper(self, role: str, **cfg: Any) -> Helper:
        self._n += 1
        h = Helper(role, cfg, self.logdir, f"{self._n:02d}-{role}")
        self.helpers.append(h)
        return h

    def daemon(self, name: str, mesh: str | None = None, secure: bool = False) -> Daemon:
        d = Daemon(name, mesh or self.mesh, self.workdir, secure)
        self.daemons.append(d)
        return d

    def cleanup(self) -> None:
        for h in self.helpers:
            if h.proc.poll() is None:
                with contextlib.suppress(Exception):
                    h.proc.kill()
                    h.proc.wait(5)
        for d in self.daemons:
            with contextlib.suppress(Exception):
                d.stop()
        if os.environ.get("BENCH_KEEP"):
            print(f"logs kept in {self.workdir}")
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ----------------------------------------------------------------- generic one-way run

    def one_way(self, label: str, receivers: list[Helper], sender: Helper,
                daemons: tuple[Daemon, ...] = ()) -> dict[str, Any]:
        for r in receivers:
            r.wait("ready", 30)
        sender.wait("ready", 30)
        cpu0 = {d.name: cpu_seconds(d) for d in daemons}
        sender.send(cmd="go")
        sent_ev = sender.wait("sent", self.duration + 30) if sender.role != "raw_source" else None
        res_ev = sender.wait("result", self.duration + 30) if sent_ev is None else sent_ev
        sent = int(res_ev["sent"])
        got = []
        for r in receivers:
            r.send(cmd="expect", n=sent, idle=TAIL_IDLE_S, cap=TAIL_CAP_S)
        for r in receivers:
            got.append(r.wait("result", TAIL_CAP_S + 10))
        cpu = {d.name: cpu_seconds(d) - cpu0[d.name] for d in daemons}
        if sent_ev is not None:
            sender.send(cmd="stop")
            final = sender.wait("result", 15)
        else:
            final = res_ev
        for h in [sender, *receivers]:
            h.finish()
        out = {
            "sent": sent, "send_rate": res_ev["rate"], "send_elapsed_s": res_ev["elapsed_s"],
            "received": [g["received"] for g in got], "rates": [g["rate"] for g in got],
            "lost": [sent - g["received"] for g in got],
            "sender_errors": final.get("errors", 0), "error_codes": final.get("error_codes", {}),
            "send_failed": final.get("send_failed", 0), "dups": [g.get("dups", 0) for g in got],
            "sender_cpu_us_per_msg": res_ev.get("cpu_us_per_msg"),
        }
        out["rate"] = min(out["rates"])
        out["lost_total"] = sum(out["lost"])
        out["daemon_cpu_s"] = cpu
        out["daemon_cpu_us_per_msg"] = {k: v * 1e6 / sent for k, v in cpu.items()} if sent else {}
        per = ", ".join(f"{k} {v:.1f}" for k, v in out["daemon_cpu_us_per_msg"].items())
        if out["sender_cpu_us_per_msg"] is not None:
            per += f"; sender (client) CPU us/msg {out['sender_cpu_us_per_msg']:.1f}"
        print(f"  {label}: {out['rate']:,.0f} msgs/s at the receiver (sender {out['send_rate']:,.0f}), "
              f"sent {sent:,}, lost {out['lost_total']:,}, sender errors {out['sender_errors']}"
              + (f"; daemon CPU us/msg: {per}" if per else ""), flush=True)
        return out

    def best(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """Best of the repetitions by rate; losses summed over all of them."""
        top = dict(max(runs, key=lambda r: r["rate"]))
        top["all_rates"] = [r["rate"] for r in runs]
        top["runs"] = [{k: v for k, v in r.items() if k != "runs"} for r in runs]
        top["lost_all_runs"] = sum(r["lost_total"] for r in runs)
        top["sender_errors_all_runs"] = sum(r["sender_errors"] for r in runs)
        return top

    # ----------------------------------------------------------------- scenarios

    def raw_throughput(self) -> dict[str, Any]:
        sink = self.helper("raw_sink")
        ep = sink.wait("ready", 30)["endpoint"]
        src = self.helper("raw_source", endpoint=ep, max_n=3_000_000, duration=self.duration)
        return self.one_way("(a) raw pyzmq one-way", [sink], src)

    def raw_rtt(self) -> dict[str, Any]:
        echo = self.helper("raw_echo")
        ep = echo.wait("ready", 30)["endpoint"]
        rtt = self.helper("raw_rtt", endpoint=ep, n=self.rtt_n, warmup=200, max_time=20)
        rtt.wait("ready", 30)
        rtt.send(cmd="go")
        res = rtt.wait("result", 40)
        echo.send(cmd="stop")
        rtt.finish()
        echo.finish()
        print(f"  (a) raw pyzmq rtt: p50 {res['p50_us']:.0f} us, p99 {res['p99_us']:.0f} us", flush=True)
        return res

    def relay_rtt(self) -> dict[str, Any]:
        """Request/reply through two minimal pyzmq relays (same 6 hops as meshd)."""
        ra = self.helper("raw_relay", ipc=str(self.workdir / "ra.sock"))
        rb = self.helper("raw_relay", ipc=str(self.workdir / "rb.sock"))
        ea, eb = ra.wait("ready", 30)["endpoint"], rb.wait("ready", 30)["endpoint"]
        ra.send(peer=eb)
        rb.send(peer=ea)
        echo = self.helper("raw_echo_dealer", endpoint=f"ipc://{self.workdir / 'rb.sock'}")
        echo.wait("ready", 30)
        rtt = self.helper("raw_rtt", endpoint=f"ipc://{self.workdir / 'ra.sock'}", n=self.rtt_n,
                          warmup=200, max_time=20)
        rtt.wait("ready", 30)
        rtt.send(cmd="go")
        res = rtt.wait("result", 40)
        for h in (echo, ra, rb):
            h.send(cmd="stop")
        for h in (rtt, echo, ra, rb):
            h.finish()
        print(f"  (c'') raw pyzmq 2-relay rtt: p50 {res['p50_us']:.0f} us, p99 {res['p99_us']:.0f} us",
              flush=True)
        return res

    def mesh_throughput(self, a: Daemon, b: Daemon, tag: str,
                        label: str = "(b) meshd one-way") -> dict[str, Any]:
        name = f"recv-{tag}"
        recv = self.helper("mesh_recv", name=name, socket=str(b.socket), topic="bench")
        recv.wait("ready", 30)
        snd = self.helper("mesh_send", name=f"send-{tag}", socket=str(a.socket), to=name,
                          max_n=3_000_000, duration=self.duration)
        return self.one_way(label, [recv], snd, daemons=(a, b))

    def qos1_throughput(self, a: Daemon, b: Daemon, tag: str) -> dict[str, Any]:
        """(g) as (b) with ``send(..., qos=1)``, QOS1_WINDOW sends in flight (one gather each)."""
        name = f"q1recv-{tag}"
        recv = self.helper("mesh_recv", name=name, socket=str(b.socket), topic="bench", dedupe=True)
        recv.wait("ready", 30)
        snd = self.helper("mesh_send", name=f"q1send-{tag}", socket=str(a.socket), to=name,
                          max_n=3_000_000, duration=self.duration, qos=1, window=QOS1_WINDOW,
                          lanes=QOS1_LANES)
        before = {d.name: self._node_info(d).get("qos1", {}) for d in (a, b)}
        out = self.one_way("(g) meshd qos 1 one-way", [recv], snd, daemons=(a, b))
        # Wait (bounded) until daemon A's outbox is empty: every unit acked, its delete committed.
        end = time.monotonic() + 10
        after: dict[str, dict[str, Any]] = {}
        while True:
            after = {d.name: self._node_info(d).get("qos1", {}) for d in (a, b)}
            if after[a.name].get("pending", 1) == 0 or time.monotonic() > end:
                break
            time.sleep(0.05)
        delta = {n: {k: v - before[n].get(k, 0) for k, v in after[n].items()
                     if isinstance(v, int) and k not in ("pending", "in_flight")} for n in after}
        out["qos1"] = {"window": QOS1_WINDOW, "lanes": QOS1_LANES, "delta": delta,
                       "pending_after": {n: after[n].get("pending") for n in after}}
        commits = delta[a.name].get("commits", 0)
        units = delta[a.name].get("accepted", 0)
        out["a_commits"] = commits
        out["a_units"] = units
        out["msgs_per_a_commit"] = out["sent"] / commits if commits else 0.0
        out["dups_total"] = sum(out["dups"])
        print(f"    qos 1: daemon A {commits:,} commits for {out['sent']:,} messages in {units:,} units "
              f"({out['msgs_per_a_commit']:.0f} msgs per commit; B {delta[b.name].get('commits', 0):,} "
              f"commits); duplicates at the receiver {out['dups_total']}, sends failed "
              f"{out['send_failed']}, A outbox left {after[a.name].get('pending')}", flush=True)
        return out

    def secure_pair(self) -> tuple[Daemon, Daemon, dict[str, Any]]:
        """Two daemons with CurveZMQ on (trust_mode keys), trusting each other's node key."""
        from meshd.keys import load_or_create_node_keys, trust_key

        mesh = f"{self.mesh}s"  # a mesh of their own: they never meet the plaintext pair
        sa, sb = self.daemon("SA", mesh, secure=True), self.daemon("SB", mesh, secure=True)
        ka, kb = load_or_create_node_keys(sa.state_dir), load_or_create_node_keys(sb.state_dir)
        trust_key(sa.state_dir / "authorized_keys", sb.name, kb.public)
        trust_key(sb.state_dir / "authorized_keys", sa.name, ka.public)
        sa.start()
        sa.wait_ready()
        disc = asyncio.run(self.discovery(sa, sb))
        if "new_sees_old_ms" not in disc or "old_sees_new_ms" not in disc:
            raise RuntimeError(f"CURVE daemons SA and SB never saw each other:\n{sa.log()}\n{sb.log()}")
        for d in (sa, sb):
            info = self._node_info(d)
            if info.get("insecure") or not info.get("public_key"):
                raise RuntimeError(f"daemon {d.name} is not in secure mode: {info}")
        return sa, sb, disc

    def wire_throughput(self, a: Daemon, b: Daemon, tag: str, raw_receiver: bool) -> dict[str, Any]:
        name = f"wrecv-{tag}"
        if raw_receiver:
            recv = self.helper("wire_recv", name=name, socket=str(b.socket))
        else:
            recv = self.helper("mesh_recv", name=name, socket=str(b.socket), topic="bench")
        recv.wait("ready", 30)
        snd = self.helper("wire_send", name=f"wsend-{tag}", socket=str(a.socket), to=name,
                          max_n=self.wire_max_n, duration=self.duration, batch=64)
        label = "(f) raw wire both ends" if raw_receiver else "(e) raw wire sender -> Agent"
        return self.one_way(label, [recv], snd, daemons=(a, b))

    def mesh_rtt(self, a: Daemon, b: Daemon, wire: bool = False, label: str = "") -> dict[str, Any]:
        kind = "wire" if wire else "mesh"
        echo = self.helper(f"{kind}_echo", name=f"echo-{kind}", socket=str(b.socket))
        echo.wait("ready", 30)
        rtt = self.helper(f"{kind}_rtt", name=f"asker-{kind}", socket=str(a.socket), to=f"echo-{kind}",
                          n=self.rtt_n, warmup=200, max_time=20)
        rtt.wait("ready", 30)
        cpu0 = {d.name: cpu_seconds(d) for d in (a, b)}
        rtt.send(cmd="go")
        res = rtt.wait("result", 40)
        res["daemon_cpu_s"] = {d.name: cpu_seconds(d) - cpu0[d.name] for d in (a, b)}
        echo.send(cmd="stop")
        echo.wait("result", 10)
        rtt.finish()
        echo.finish()
        label = label or ("(c') raw wire rtt" if wire else "(c) meshd rtt")
        print(f"  {label}: p50 {res['p50_us']:.0f} us, p99 {res['p99_us']:.0f} us", flush=True)
        return res

    def wire_publish(self, a: Daemon, b: Daemon, tag: str, n_subs: int = 4) -> dict[str, Any]:
        """(d') as (d), the publisher a raw DEALER sending pre-encoded publish batches."""
        topic = f"wpub-{tag}"
        subs = [self.helper("mesh_recv", name=f"wsub{k}-{tag}", socket=str(b.socket), topic=topic,
                            subscribe=True) for k in range(n_subs)]
        for sub in subs:
            sub.wait("ready", 30)
        pub = self.helper("wire_send", name=f"wpub-{tag}", socket=str(a.socket), topic=topic,
                          subscribers=n_subs, max_n=self.wire_max_n, duration=self.duration, batch=64)
        out = self.one_way("(d') raw wire publisher -> 4 Agents", subs, pub, daemons=(a, b))
        out["daemon_b_stats"] = self._daemon_stats(b)
        return out

    def mesh_publish(self, a: Daemon, b: Daemon, tag: str, n_subs: int = 4) -> dict[str, Any]:
        topic = f"pub-{tag}"
        subs = [self.helper("mesh_recv", name=f"sub{k}-{tag}", socket=str(b.socket), topic=topic,
                            subscribe=True) for k in range(n_subs)]
        for s in subs:
            s.wait("ready", 30)
        pub = self.helper("mesh_pub", name=f"pub-{tag}", socket=str(a.socket), topic=topic,
                          subscribers=n_subs, window=256, max_n=3_000_000, duration=self.duration)
        ready = pub.wait("ready", 40)
        cpu0 = {d.name: cpu_seconds(d) for d in (a, b)}
        pub.send(cmd="go")
        sent_ev = pub.wait("sent", self.duration + 30)
        sent = int(sent_ev["sent"])
        for sub in subs:
            sub.send(cmd="expect", n=sent, idle=TAIL_IDLE_S, cap=TAIL_CAP_S)
        got = [sub.wait("result", TAIL_CAP_S + 10) for sub in subs]
        cpu = {d.name: cpu_seconds(d) - cpu0[d.name] for d in (a, b)}
        pub.send(cmd="stop")
        final = pub.wait("result", 10)
        for h in [pub, *subs]:
            h.finish()
        out = {
            "sent": sent, "publish_rate": sent_ev["rate"], "reached_at_warmup": ready["reached"],
            "reached_hist": sent_ev["reached_hist"], "publisher_errors": final["errors"],
            "received": [g["received"] for g in got], "rates": [g["rate"] for g in got],
            "lost": [sent - g["received"] for g in got],
        }
        out["rate"] = min(out["rates"])
        out["lost_total"] = sum(out["lost"])
        out["sender_errors"] = final["errors"]
        out["daemon_cpu_s"] = cpu
        out["daemon_cpu_us_per_msg"] = {k: v * 1e6 / sent for k, v in cpu.items()} if sent else {}
        print(f"  (d) meshd publish: {out['publish_rate']:,.0f} publishes/s, per subscriber "
              f"{', '.join(f'{r:,.0f}' for r in out['rates'])} msgs/s, lost {out['lost']}, "
              f"reached {out['reached_hist']}", flush=True)
        return out

    # ----------------------------------------------------------------- discovery and liveness

    async def _probe(self, d: Daemon, name: str) -> Any:
        from meshd.client import Agent

        agent = Agent(name, socket=str(d.socket))
        await agent.connect()
        return agent

    async def _sees_online(self, agent: Any, node_id: str) -> bool:
        return any(p["node"] == node_id and p["state"] == "online" for p in await agent.peers())

    async def discovery(self, old: Daemon, new: Daemon, timeout: float = 10.0) -> dict[str, Any]:
        """Start ``new``; time until old lists new online, and new lists old online."""
        pa = await self._probe(old, f"probe-{new.name}-old")
        out: dict[str, Any] = {}
        try:
            new.start()
            t0 = new.spawned_at

            async def old_side() -> None:
                end = t0 + timeout
                while time.monotonic() < end:
                    if await self._sees_online(pa, new.node_id):
                        out["old_sees_new_ms"] = (time.monotonic() - t0) * 1000
                        return
                    await asyncio.sleep(0.005)

            async def new_side() -> None:
                end = t0 + timeout
                while not new.socket.exists() and time.monotonic() < end:  # noqa: ASYNC110
                    await asyncio.sleep(0.002)
                out["new_ready_ms"] = (time.monotonic() - t0) * 1000
                pb = await self._probe(new, f"probe-{new.name}-new")
                try:
                    while time.monotonic() < end:
                        if await self._sees_online(pb, old.node_id):
                            out["new_sees_old_ms"] = (time.monotonic() - t0) * 1000
                            return
                        await asyncio.sleep(0.005)
                finally:
                    await pb.close()

            await asyncio.wait_for(asyncio.gather(old_side(), new_side()), timeout + 5)
        finally:
            await pa.close()
        out["both_ways_ms"] = max(out.get("old_sees_new_ms", float("inf")),
                                  out.get("new_sees_old_ms", float("inf")))
        out["after_ready_ms"] = out["both_ways_ms"] - out.get("new_ready_ms", 0.0)
        print(f"  discovery {old.name}<->{new.name}: new daemon ready (socket bound) after "
              f"{out.get('new_ready_ms', float('nan')):.0f} ms; {old.name} sees it online at "
              f"{out.get('old_sees_new_ms', float('inf')):.0f} ms, it sees {old.name} at "
              f"{out.get('new_sees_old_ms', float('inf')):.0f} ms (from process start)", flush=True)
        return out

    async def stale_after_kill(self, observer: Daemon, victim: Daemon,
                               timeout: float = 15.0) -> dict[str, Any]:
        pa = await self._probe(observer, f"probe-kill-{victim.name}")
        out: dict[str, Any] = {}
        try:
            assert await self._sees_online(pa, victim.node_id), "victim not online before the kill"
            assert victim.proc is not None
            t0 = time.monotonic()
            victim.proc.send_signal(signal.SIGKILL)
            end = t0 + timeout
            while time.monotonic() < end:
                states = {p["node"]: p["state"] for p in await pa.peers()}
                state = states.get(victim.node_id)
                if state != "online":
                    out["stale_ms"] = (time.monotonic() - t0) * 1000
                    out["state"] = state
                    break
                await asyncio.sleep(0.005)
            victim.proc.wait(5)
        finally:
            await pa.close()
        print(f"  SIGKILL {victim.name}: {observer.name} sees it {out.get('state')} after "
              f"{out.get('stale_ms', float('inf')):.0f} ms", flush=True)
        return out

    # ----------------------------------------------------------------- the run

    def guarded(self, key: str, fn: Any, *args: Any) -> Any:
        """Run one scenario; a failure is recorded (and shown as ERROR) instead of ending the run."""
        try:
            return fn(*args)
        except Exception as exc:
            print(f"  {key}: FAILED: {type(exc).__name__}: {str(exc)[:600]}", flush=True)
            self.results.setdefault("errors", {})[key] = f"{type(exc).__name__}: {exc}"
            return None

    def repeat(self, key: str, fn: Any, *args: Any, reps: int | None = None) -> None:
        runs = [self.guarded(key, fn, *args, f"{key}{k}") for k in range(reps or self.reps)]
        runs = [x for x in runs if x is not None]
        if runs:
            self.results[key] = self.best(runs)

    def run(self) -> dict[str, Any]:
        r = self.results
        r["meta"] = {
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores",
            "python": platform.python_version(), "pyzmq": zmq.__version__,
            "libzmq": zmq.zmq_version(), "msgpack": ".".join(map(str, msgpack.version)),
            "payload_bytes": payload_size(), "quick": self.quick, "duration_s": self.duration,
            "reps": self.reps, "mesh": self.mesh, "loadavg_at_start": os.getloadavg(),
        }
        print(f"meshd bench: payload {r['meta']['payload_bytes']} bytes, {self.duration:g} s per "
              f"throughput run, best of {self.reps}; mesh {self.mesh}", flush=True)

        from meshd import protocol as P
        if P.SIGNATURE != SIG:
            raise RuntimeError(f"bench SIG {SIG!r} != meshd.protocol.SIGNATURE {P.SIGNATURE!r}")

        a = self.daemon("A")
        a.start()
        r["daemon_a_ready_ms"] = a.wait_ready() * 1000
        b = self.daemon("B")
        disc = [asyncio.run(self.discovery(a, b))]
        if "new_sees_old_ms" not in disc[0] or "old_sees_new_ms" not in disc[0]:
            raise RuntimeError(f"daemons A and B never saw each other:\n{a.log()}\n{b.log()}")

        print("raw pyzmq:", flush=True)
        raw_tp = [x for x in (self.guarded("raw_tp", self.raw_throughput) for _ in range(self.reps)) if x]
        r["raw_rtt"] = self.guarded("raw_rtt", self.raw_rtt)
        r["relay_rtt"] = self.guarded("relay_rtt", self.relay_rtt)
        print("meshd (CURVE pair SA, SB started first):", flush=True)
        secure = self.guarded("curve_daemons", self.secure_pair)
        if secure:
            r["curve_discovery"] = secure[2]
        # (b) qos 0, (g) qos 1 and (h) CURVE one-way interleaved, so that their ratios compare
        # runs made under the same background load.
        tp_runs: dict[str, list[dict[str, Any] | None]] = {"mesh_tp": [], "qos1_tp": [], "curve_tp": []}
        for k in range(self.reps):
            tp_runs["mesh_tp"].append(self.guarded("mesh_tp", self.mesh_throughput, a, b, f"mesh_tp{k}"))
            tp_runs["qos1_tp"].append(self.guarded("qos1_tp", self.qos1_throughput, a, b, f"qos1_tp{k}"))
            if secure:
                tp_runs["curve_tp"].append(self.guarded(
                    "curve_tp", self.mesh_throughput, secure[0], secure[1], f"curve_tp{k}",
                    "(h) CURVE one-way"))
        for key, runs in tp_runs.items():
            done = [x for x in runs if x is not None]
            if done:
                r[key] = self.best(done)
        # Per repetition: the ratio of two runs made back to back (the table's ratio is best/best).
        r["pair_ratios"] = {
            name: [x["rate"] / z["rate"] for x, z in zip(tp_runs[key], tp_runs["mesh_tp"], strict=False)
                   if x is not None and z is not None and z["rate"]]
            for name, key in (("qos1/qos0", "qos1_tp"), ("curve/plain", "curve_tp"))
        }
        r["mesh_rtt"] = self.guarded("mesh_rtt", self.mesh_rtt, a, b)
        if secure:
            r["curve_rtt"] = self.guarded("curve_rtt", self.mesh_rtt, secure[0], secure[1], False,
                                          "(h) CURVE rtt")
            r["curve_auth"] = {d.name: self._node_info(d).get("auth", {}) for d in secure[:2]}
            for d in secure[:2]:
                d.stop()
        r["wire_rtt"] = self.guarded("wire_rtt", self.mesh_rtt, a, b, True)
        self.repeat("publish", self.mesh_publish, a, b)
        self.repeat("wire_publish", self.wire_publish, a, b)
        self.repeat("wire_tp", lambda a, b, tag: self.wire_throughput(a, b, tag, False), a, b)
        self.repeat("wire_raw_tp", lambda a, b, tag: self.wire_throughput(a, b, tag, True), a, b)
        again = self.guarded("raw_tp", self.raw_throughput)  # raw again after meshd (noise check)
        raw_tp += [again] if again else []
        if raw_tp:
            r["raw_tp"] = self.best(raw_tp)

        # Counters after the load runs, before the kill tests (a peer seen stale here is spurious).
        r["daemon_stats_after_load"] = {d.name: self._daemon_stats(d) for d in (a, b)}

        print("discovery and liveness:", flush=True)
        kills = [self.guarded("stale", lambda: asyncio.run(self.stale_after_kill(a, b)))]
        for k in range(1 if self.quick else 2):
            c = self.daemon(f"C{k}")
            disc.append(self.guarded("discovery", lambda c=c: asyncio.run(self.discovery(a, c))))
            kills.append(self.guarded("stale", lambda c=c: asyncio.run(self.stale_after_kill(a, c))))
        r["discovery"] = [d for d in disc if d]
        r["stale"] = [k for k in kills if k]
        r["daemon_a_stats"] = self._daemon_stats(a)
        r["meta"]["loadavg_at_end"] = os.getloadavg()
        return r

    def _node_info(self, d: Daemon) -> dict[str, Any]:
        """The daemon's whole ``node_info()`` (asked by a probe Agent); {} if it cannot answer."""
        async def ask() -> Any:
            agent = await self._probe(d, "probe-info")
            try:
                return await agent.node_info()
            finally:
                await agent.close()
        try:
            return dict(asyncio.run(ask()))
        except Exception as exc:
            return {"error": str(exc)}

    def _daemon_stats(self, d: Daemon) -> dict[str, Any]:
        async def ask() -> Any:
            agent = await self._probe(d, "probe-stats")
            try:
                return (await agent.node_info()).get("stats", {})
            finally:
                await agent.close()
        try:
            return dict(asyncio.run(ask()))
        except Exception as exc:  # informational only
            return {"error": str(exc)}


# ===================================================================================== report

def build_table(r: dict[str, Any]) -> list[list[str]]:
    """Rows: scenario | metric | meshd | raw pyzmq | ratio | goal | met?  (ERROR if it failed)."""
    rows: list[list[str]] = []

    def add(scn: str, metric: str, fn: Any, goal: str = "") -> None:
        try:
            mesh, raw, ratio, met = fn()
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            rows.append([scn, metric, "ERROR", "", "", goal, "NO" if goal else "-"])
            return
        rows.append([scn, metric, mesh, raw, ratio, goal, "-" if met is None else ("yes" if met else "NO")])

    def rate(x: float) -> str:
        return f"{x:,.0f}"

    def tp(key: str, goal_rate: float | None = None, goal_ratio: float | None = None) -> Any:
        def f() -> Any:
            m, raw = r[key]["rate"], r["raw_tp"]["rate"]
            met = (m >= goal_rate) if goal_rate else (m / raw >= goal_ratio) if goal_ratio else None
            return rate(m), rate(raw), f"{m / raw:.2f}", met
        return f

    def lost(key: str) -> Any:
        def f() -> Any:
            n = r[key]["lost_all_runs"]
            codes: dict[str, int] = {}
            for run in r[key].get("runs", []):
                for code, k in (run.get("error_codes") or {}).items():
                    codes[code] = codes.get(code, 0) + k
            told = ", ".join(f"{k} {c}" for c, k in codes.items())
            return (f"{n} ({told} reported)" if told else str(n)), "", "", n == 0
        return f

    def lat(key: str, base: str, goal_p50: float | None = None) -> Any:
        def f() -> Any:
            m, b = r[key], r[base]
            return (f"{m['p50_us']:.0f} / {m['p99_us']:.0f}", f"{b['p50_us']:.0f} / {b['p99_us']:.0f}",
                    f"{m['p50_us'] / b['p50_us']:.1f}x / {m['p99_us'] / b['p99_us']:.1f}x",
                    (m["p50_us"] < goal_p50) if goal_p50 else None)
        return f

    add("(a) raw pyzmq", "one-way msgs/s", lambda: ("", rate(r["raw_tp"]["rate"]), "", None))
    add("(a) raw pyzmq", "lost", lambda: ("", str(r["raw_tp"]["lost_all_runs"]), "", None))
    add("(a) raw pyzmq", "rtt p50 / p99 us", lambda: ("", f"{r['raw_rtt']['p50_us']:.0f} / "
                                                          f"{r['raw_rtt']['p99_us']:.0f}", "", None))
    add("(b) one-way A->B", "msgs/s at receiver", tp("mesh_tp", goal_rate=60_000), ">= 60,000")
    add("(b) one-way A->B", "lost (all runs)", lost("mesh_tp"), "0")

    def pairs(name: str) -> str:
        each = r.get("pair_ratios", {}).get(name, [])
        return f" (per rep {', '.join(f'{x:.2f}' for x in each)})" if len(each) > 1 else ""

    def q1_ratio() -> Any:
        q, z = r["qos1_tp"]["rate"], r["mesh_tp"]["rate"]
        return f"{q / z:.2f}{pairs('qos1/qos0')}", "", "", q / z >= 1 / 3

    def q1_commits() -> Any:
        q = r["qos1_tp"]
        return (f"{q['msgs_per_a_commit']:.0f} ({q['a_commits']:,} for {q['sent']:,})", "", "", None)

    def q1_dups() -> Any:
        runs = r["qos1_tp"]["runs"]
        return (f"{sum(x['dups_total'] for x in runs)} / {sum(x['send_failed'] for x in runs)}",
                "", "", None)

    add("(g) qos 1 one-way A->B", "msgs/s at receiver", tp("qos1_tp"), "(info)")
    add("(g) qos 1 one-way A->B", "qos 1 / qos 0 (b) msgs/s", q1_ratio, ">= 0.33")
    add("(g) qos 1 one-way A->B", "lost (all runs)", lost("qos1_tp"), "0")
    add("(g) qos 1 one-way A->B", "duplicates / failed sends", q1_dups, "(info)")
    add("(g) qos 1 one-way A->B", "msgs per commit, daemon A", q1_commits, "(info)")

    def curve_tp_ratio() -> Any:
        c, z = r["curve_tp"]["rate"], r["mesh_tp"]["rate"]
        return f"{c / z:.2f}{pairs('curve/plain')}", "", "", c / z >= 0.7

    def curve_lat_ratio() -> Any:
        c, z = r["curve_rtt"], r["mesh_rtt"]
        return f"{c['p50_us'] / z['p50_us']:.2f}x / {c['p99_us'] / z['p99_us']:.2f}x", "", "", None

    add("(h) CURVE one-way", "msgs/s at receiver", tp("curve_tp"), "(info)")
    add("(h) CURVE one-way", "CURVE / plaintext (b) msgs/s", curve_tp_ratio, ">= 0.70")
    add("(h) CURVE one-way", "lost (all runs)", lost("curve_tp"), "0")
    add("(h) CURVE request/reply", "rtt p50 / p99 us", lat("curve_rtt", "raw_rtt"), "(info)")
    add("(h) CURVE request/reply", "CURVE / plaintext (c) p50 / p99", curve_lat_ratio, "(info)")
    add("(c) request/reply", "rtt p50 / p99 us", lat("mesh_rtt", "raw_rtt", 450), "p50 < 450")
    add("(c') raw-wire req/rep", "rtt p50 / p99 us", lat("wire_rtt", "raw_rtt"), "(info)")
    add("(c'') (c) vs 2 relays", "rtt p50 / p99 us", lat("mesh_rtt", "relay_rtt"), "(info)")
    add("(d) publish, 4 subs", "msgs/s per sub (min)", tp("publish", goal_rate=25_000), ">= 25,000")
    add("(d) publish, 4 subs", "lost (all runs, subs)", lost("publish"), "0")
    add("(d') raw-wire publisher", "msgs/s per sub (min)", tp("wire_publish"), "(info)")
    add("(d') raw-wire publisher", "lost (all runs, subs)", lost("wire_publish"), "0")
    add("(e) raw-wire sender", "msgs/s at receiver", tp("wire_tp", goal_ratio=0.4), ">= 0.40 of (a)")
    add("(e) raw-wire sender", "lost (all runs)", lost("wire_tp"), "0")
    add("(f) raw wire both ends", "msgs/s at receiver", tp("wire_raw_tp"), "(info)")
    add("(f) raw wire both ends", "lost (all runs)", lost("wire_raw_tp"), "0")

    def flips() -> Any:
        st = r["daemon_stats_after_load"]
        return " / ".join(str(st[n].get("peer_stale", 0)) for n in ("A", "B")), "", "", None

    def drops() -> Any:
        st = r["daemon_stats_after_load"]
        keys = ("publish_local_dropped", "publish_remote_dropped", "topic_dropped", "malformed")
        return " / ".join(str(sum(st[n].get(k, 0) for k in keys)) for n in ("A", "B")), "", "", None

    add("under load", "peers flipped stale, A / B", flips, "(info)")
    add("under load", "batches dropped in daemons, A / B", drops, "(info)")

    def disc() -> Any:
        worst = max(d["both_ways_ms"] for d in r["discovery"])
        return f"{worst:.0f}", "", "", worst <= 500

    add("discovery", "both ways, ms from spawn (worst)", disc, "<= 500")
    add("discovery", "  spawn -> socket bound", lambda: (
        f"{max(d['new_ready_ms'] for d in r['discovery']):.0f}", "", "", None))
    add("discovery", "  socket bound -> both online", lambda: (
        f"{max(d['after_ready_ms'] for d in r['discovery']):.0f}", "", "", None))

    def stale() -> Any:
        worst = max(k["stale_ms"] for k in r["stale"])
        return f"{worst:.0f}", "", "", worst <= 1000

    add("SIGKILL", "seen stale by peer, ms (worst)", stale, "<= 1000")
    return rows


def print_table(rows: list[list[str]]) -> None:
    head = ["scenario", "metric", "meshd", "raw pyzmq", "ratio", "goal", "met?"]
    widths = [max(len(head[i]), *(len(row[i]) for row in rows)) for i in range(len(head))]
    line = " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    print()
    print(line)
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    print("ratio = meshd / raw pyzmq (throughput: fraction of raw; latency: times slower); "
          "'X / Y' rows hold that ratio in the meshd column")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs, one repetition (~40 s)")
    ap.add_argument("--json", type=Path, help="write every measurement to this JSON file")
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        ROLES[args.role](json.loads(args.cfg or "{}"))
        return 0
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the finally below still cleans up
    bench = Bench(args.quick)
    status = 0
    try:
        results = bench.run()
    except Exception as exc:
        print(f"bench aborted: {type(exc).__name__}: {exc}", flush=True)
        results, status = bench.results, 1
    finally:
        bench.cleanup()
    if "meta" not in results:
        return 1
    rows = build_table(results)
    results["table"] = rows
    results["total_s"] = time.monotonic() - t0
    print_table(rows)
    print(f"total {results['total_s']:.0f} s; {results['meta']['date']}; {results['meta']['machine']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
        print(f"wrote {args.json}")
    if results.get("errors"):
        print(f"scenarios that failed: {', '.join(results['errors'])}")
    return status


if __name__ == "__main__":
    sys.exit(main())
