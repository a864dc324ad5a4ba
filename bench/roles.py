"""The helper processes of the benchmark: ``bench.py --role NAME --cfg JSON`` runs ``ROLES[NAME]``.

A helper prints ``{"event": "ready", ...}``, follows the commands it reads from stdin as JSON lines
(``go``, ``expect n``, ``stop``), prints ``{"event": "result", ...}`` and exits. A closed stdin
(orchestrator gone) stops it, and so does HELPER_HARD_TIMEOUT, whatever happens.

Three families: raw pyzmq (a, c''), meshd ``Agent`` (b, c, d, g, h) and raw DEALERs speaking
meshd's local protocol (c', d', e, f). What they have in common is written once at the top: the
poll loop (``serve``), counting with a bounded wait for the tail (``Tally``, ``Tail``,
``count_until_told``), the latency loop (``timed``) and socket set-up (``zsocket``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import msgpack
import zmq
from common import HELPER_HARD_TIMEOUT, LOOPBACK, SIG, TAIL_CAP_S, TAIL_IDLE_S, make_payload

if TYPE_CHECKING:
    from meshd.client import Agent

Frames = list[bytes]
Socket = zmq.Socket[Any]
Cfg = dict[str, Any]
BURST = 4096  # messages taken from one socket per wake-up, so one busy socket cannot starve the rest
HEARTBEAT_S = 0.5  # raw local-protocol agents must heartbeat, or their daemon drops them


# ========================================================================================== plumbing

def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _parse_cmd(line: str) -> Cfg:
    if not line:  # EOF: the orchestrator is gone
        raise SystemExit(3)
    return dict(json.loads(line))


def read_cmd() -> Cfg:
    """The next command line; only call when stdin is readable (the poll loops check first)."""
    return _parse_cmd(sys.stdin.readline())


def wait_cmd(timeout: float = HELPER_HARD_TIMEOUT) -> Cfg:
    """Block for the next command, at most ``timeout`` s (zmq.Poller watches the fd)."""
    poller = zmq.Poller()
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    if not poller.poll(int(timeout * 1000)):
        raise TimeoutError("no command from the orchestrator")
    return read_cmd()


async def wait_cmd_async(timeout: float = HELPER_HARD_TIMEOUT) -> Cfg:
    loop = asyncio.get_running_loop()
    return _parse_cmd(await asyncio.wait_for(loop.run_in_executor(None, sys.stdin.readline), timeout))


@functools.cache
def _context() -> zmq.Context[Any]:
    return zmq.Context()


def zsocket(kind: int, linger: int = 0, **opts: int) -> Socket:
    """A socket on this helper's own context (``run_role`` closes them all at exit, each by its
    LINGER: 0 drops what is queued, a sender's 5000 lets its tail still go out)."""
    sock: Socket = _context().socket(kind)
    sock.setsockopt(zmq.LINGER, linger)
    for name, value in opts.items():
        sock.setsockopt(getattr(zmq, name), value)
    return sock


def loopback_router() -> tuple[Socket, str]:
    """A ROUTER on a free tcp port of 127.0.0.1 (never another interface), and its endpoint."""
    sock = zsocket(zmq.ROUTER)
    port = sock.bind_to_random_port(f"tcp://{LOOPBACK}")
    return sock, f"tcp://{LOOPBACK}:{port}"


def drain(sock: Socket, handle: Callable[[Frames], None]) -> None:
    """Hand the messages waiting on ``sock`` to ``handle``, at most BURST of them."""
    for _ in range(BURST):
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        handle(frames)


def serve(handlers: dict[Socket, Callable[[Frames], None]], *,
          on_stdin: Callable[[], bool] = lambda: True, done: Callable[[], bool] = lambda: False,
          tick: Callable[[], None] | None = None, hard_s: float = HELPER_HARD_TIMEOUT) -> None:
    """The one poll loop of every helper that waits for messages.

    Wakes at least every 100 ms: hands each readable socket's messages to its handler, runs
    ``tick`` (heartbeats), and stops when ``done()``, when ``on_stdin()`` says so after a command
    arrived (by default any line, i.e. "stop", or EOF) or after ``hard_s`` in any case.
    """
    poller = zmq.Poller()
    for sock in handlers:
        poller.register(sock, zmq.POLLIN)
    stdin = sys.stdin.fileno()
    poller.register(stdin, zmq.POLLIN)
    hard = time.monotonic() + hard_s
    while time.monotonic() < hard and not done():
        if tick is not None:
            tick()
        events = dict(poller.poll(100))
        for sock, handle in handlers.items():
            if sock in events:
                drain(sock, handle)
        if stdin in events and on_stdin():
            return


class Tally:
    """Messages received and when the first and last arrived: the receiver-side rate."""

    def __init__(self) -> None:
        self.count = self.first_k = 0
        self.first = self.last = 0.0
        self.cpu_first = 0.0  # this process's CPU time at the first arrival

    def add(self, k: int) -> None:
        if not k:
            return
        self.last = time.perf_counter()
        if not self.count:
            self.first, self.first_k, self.cpu_first = self.last, k, time.process_time()
        self.count += k

    def result(self) -> dict[str, Any]:
        """Called once the tail is done (within one 10 ms poll of the last arrival): the CPU time
        is read here, not per message (``process_time`` is a ~0.45 us syscall, which every
        receiver paid per message before, ~12 % of a meshd receiver's CPU)."""
        span = self.last - self.first
        # The first arrival opens the span, so its messages are not part of the rate.
        n = self.count - self.first_k
        cpu = time.process_time() - self.cpu_first
        return {"received": self.count, "span_s": span, "rate": n / span if span > 0 else 0.0,
                "last": self.last,  # perf_counter: the harness measures end to end from its "go"
                "cpu_us_per_msg": cpu * 1e6 / n if n > 0 else None}


class Tail:
    """When a receiver stops waiting, once told how many were sent ("expect"): all of them
    arrived, nothing new for ``idle`` s, or ``cap`` s passed (late messages are not lost ones)."""

    def __init__(self) -> None:
        self.expected: int | None = None
        self.idle = TAIL_IDLE_S
        self.cap_at = float("inf")
        self.seen = 0
        self.progress_at = time.monotonic()

    def expect(self, cmd: Cfg) -> None:
        self.expected = int(cmd["n"])
        self.idle = float(cmd.get("idle", TAIL_IDLE_S))
        self.cap_at = time.monotonic() + float(cmd.get("cap", TAIL_CAP_S))
        self.progress_at = time.monotonic()

    def done(self, count: int) -> bool:
        now = time.monotonic()
        if count != self.seen:
            self.seen, self.progress_at = count, now
        if self.expected is None:
            return False
        return count >= self.expected or now - self.progress_at > self.idle or now >= self.cap_at


def count_until_told(sock: Socket, measure: Callable[[Frames], int],
                     tick: Callable[[], None] | None = None) -> None:
    """Receive on ``sock`` and count until the "expect" command is met (see Tail); emit the result.

    ``measure`` decodes one zmq message and returns how many payloads it held (0: not a payload).
    """
    tally, tail = Tally(), Tail()

    def on_cmd() -> bool:
        tail.expect(read_cmd())
        return False

    serve({sock: lambda frames: tally.add(measure(frames))}, on_stdin=on_cmd,
          done=lambda: tail.done(tally.count), tick=tick)
    emit({"event": "result", **tally.result()})


def timed(cfg: Cfg, samples: list[int], between: Callable[[], None] | None = None) -> Iterator[int]:
    """Request numbers for a latency run: ``warmup`` untimed, then up to ``n`` timed (each sample
    is the wall time of one loop body, in ns); ends early after ``max_time`` s. ``between`` runs
    after each request, outside the timing (heartbeats)."""
    warm = int(cfg["warmup"])
    deadline = time.monotonic() + float(cfg["max_time"])
    for i in range(warm + int(cfg["n"])):
        t = time.perf_counter_ns()
        yield i
        if i >= warm:
            samples.append(time.perf_counter_ns() - t)
        if time.monotonic() > deadline:
            return
        if between is not None:
            between()


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    s = sorted(samples_ns)
    n = len(s)

    def pct(p: float) -> float:
        return s[min(n - 1, round(p / 100 * (n - 1)))] / 1000.0

    return {"n": n, "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99),
            "mean_us": statistics.fmean(s) / 1000.0, "max_us": s[-1] / 1000.0}


def emit_latency(samples: list[int]) -> None:
    emit({"event": "result", **percentiles(samples or [0])})


# Off the hot receive paths (those call msgpack directly: a wrapper is one more call per message).
pack = functools.partial(msgpack.packb, use_bin_type=True)
unpack = functools.partial(msgpack.unpackb, raw=False)


# ================================================================================ raw pyzmq (a, c'')

def raw_sink(cfg: Cfg) -> None:
    """ROUTER bound on 127.0.0.1; decodes every payload; counts."""
    sock, endpoint = loopback_router()
    emit({"event": "ready", "endpoint": endpoint})
    unpackb = msgpack.unpackb

    def measure(frames: Frames) -> int:
        unpackb(frames[1], raw=False)
        return 1

    count_until_told(sock, measure)


def raw_source(cfg: Cfg) -> None:
    """DEALER connected to the sink; msgpack-encodes a fresh payload per message."""
    # linger: what is queued still goes out at close; SNDTIMEO: a stuck receiver ends the run.
    sock = zsocket(zmq.DEALER, linger=5000, SNDTIMEO=5000)
    sock.connect(cfg["endpoint"])
    emit({"event": "ready"})
    wait_cmd()
    packb = msgpack.packb
    send = sock.send
    max_n = int(cfg["max_n"])
    deadline = time.perf_counter() + float(cfg["duration"])
    t0 = time.perf_counter()
    i = 0
    try:  # the hot loop stays inline: a call per message would tax what is measured
        while i < max_n:
            send(packb(make_payload(i), use_bin_type=True))
            i += 1
            if not i & 1023 and time.perf_counter() > deadline:
                break
    except zmq.Again:
        pass
    elapsed = time.perf_counter() - t0
    emit({"event": "result", "sent": i, "elapsed_s": elapsed, "rate": i / elapsed, "errors": 0})


def raw_echo(cfg: Cfg) -> None:
    """ROUTER that decodes each request and answers with the re-encoded payload."""
    sock, endpoint = loopback_router()
    emit({"event": "ready", "endpoint": endpoint})
    answered = 0

    def answer(frames: Frames) -> None:
        nonlocal answered
        rid, data = frames
        sock.send_multipart([rid, pack(unpack(data))])
        answered += 1

    serve({sock: answer})
    emit({"event": "result", "answered": answered})


def raw_echo_dealer(cfg: Cfg) -> None:
    """DEALER connected to a relay: decodes each request and sends the re-encoded payload back."""
    sock = zsocket(zmq.DEALER)
    sock.connect(cfg["endpoint"])
    sock.send(b"hello")  # the relay learns our routing id from the first message
    emit({"event": "ready"})
    serve({sock: lambda frames: sock.send(pack(unpack(frames[0])))})
    emit({"event": "result"})


def raw_rtt(cfg: Cfg) -> None:
    """DEALER that sends sequential requests (encode, send, recv, decode) and times each."""
    sock = zsocket(zmq.DEALER, RCVTIMEO=5000, SNDTIMEO=5000)
    sock.connect(cfg["endpoint"])
    emit({"event": "ready"})
    wait_cmd()
    samples: list[int] = []
    with contextlib.suppress(zmq.Again):
        for i in timed(cfg, samples):
            sock.send(pack(make_payload(i)))
            unpack(sock.recv())
    emit_latency(samples)


def raw_relay(cfg: Cfg) -> None:
    """A minimal pyzmq 'daemon' with meshd's socket layout, in a plain zmq.Poller loop.

    Local ROUTER on ipc (agents' DEALERs connect), mesh ROUTER on tcp 127.0.0.1 (the peer's
    DEALER connects), one DEALER to the peer's mesh ROUTER. Whatever the local agent sends goes to
    the peer; whatever the peer sends goes to the (single) local agent. No header decoding: this
    is the floor a Python daemon with this topology can reach on this machine.
    """
    local = zsocket(zmq.ROUTER)
    local.bind(f"ipc://{cfg['ipc']}")
    mesh, endpoint = loopback_router()
    emit({"event": "ready", "endpoint": endpoint})
    dealer = zsocket(zmq.DEALER)
    dealer.connect(wait_cmd(30)["peer"])
    agent_rid: bytes | None = None  # the local agent's routing id, once it has said something

    def up(frames: Frames) -> None:
        nonlocal agent_rid
        agent_rid = frames[0]
        dealer.send_multipart(frames[1:])

    def down(frames: Frames) -> None:
        if agent_rid is not None:
            local.send_multipart([agent_rid, *frames[1:]])

    serve({local: up, mesh: down})
    emit({"event": "result"})


# ======================================================================= meshd Agent (b, c, d, g, h)

def _agent(cfg: Cfg) -> Agent:
    from meshd.client import Agent

    if "_node" in cfg:  # roles_embedded.py: the node runs in this process; attach in-process
        return Agent(cfg["name"], embedded=cfg["_node"])
    return Agent(cfg["name"], socket=cfg["socket"])


async def _wait_known(me: Any, name: str, timeout: float = 15.0) -> None:
    """Wait until the local daemon's directory lists ``name`` (learned from the other daemon)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(a.get("name") == name for a in await me.agents()):
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"agent {name!r} never appeared in the directory")


async def mesh_recv(cfg: Cfg) -> None:
    """An Agent that counts the payloads it receives on a topic (direct or subscribed)."""
    tally = Tally()
    extra = {"warm": 0, "dups": 0}
    dedupe = bool(cfg.get("dedupe"))  # qos 1 is at least once: count each seq once
    seen_seqs: set[int] = set()
    async with _agent(cfg) as me:
        topic = cfg["topic"]

        def count(msg: Any) -> None:
            if msg.payload.get("warm"):
                extra["warm"] += 1
                return
            if dedupe:
                seq = msg.payload["seq"]
                if seq in seen_seqs:
                    extra["dups"] += 1
                    return
                seen_seqs.add(seq)
            tally.add(1)

        if cfg.get("typed"):  # a typed topic: the payload validated into a model, then handled
            from pydantic import BaseModel

            class BenchPayload(BaseModel):
                id: str
                ts: float
                seq: int
                body: str
                warm: bool = False

            @me.on(topic, accepts=BenchPayload, version="1.0")
            async def on_msg_typed(msg: Any) -> None:
                if msg.payload.warm:  # what count() does, on the model's attributes
                    extra["warm"] += 1
                    return
                tally.add(1)
        elif cfg.get("async_handler"):  # the README's way: an ``async def`` handler
            @me.on(topic)
            async def on_msg_async(msg: Any) -> None:
                count(msg)
        else:  # (extra rows) a plain ``def`` handler, which the client runs inline
            me.on(topic)(count)

        if cfg.get("subscribe"):
            await me.subscribe(topic)
        emit({"event": "ready"})
        tail = Tail()
        tail.expect(await wait_cmd_async())
        while not tail.done(tally.count):  # noqa: ASYNC110 (bounded: Tail gives up)
            await asyncio.sleep(0.01)
        emit({"event": "result", **tally.result(), **extra, "errors": me.errors_received})


async def mesh_send(cfg: Cfg) -> None:
    errors: dict[str, int] = {}
    refused = [0]  # qos 0: messages refused with INBOX_FULL, which a well-behaved sender resends

    def on_error(err: Any, corr: Any) -> None:
        errors[err.code] = errors.get(err.code, 0) + 1
        if err.code == "INBOX_FULL":
            refused[0] += 1

    async with _agent(cfg) as me:
        me.on_error = on_error
        await _wait_known(me, cfg["to"])
        emit({"event": "ready"})
        await wait_cmd_async()
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
        rate = float(cfg.get("rate") or 0)  # > 0: a steady load of this many msgs/s (soak)
        if qos == 0:
            seen_refusals = 0
            while i < max_n:
                await send(to, "bench", make_payload(i))
                i += 1
                if rate and not i & 63 and (ahead := t0 + i / rate - time.perf_counter()) > 0:
                    await asyncio.sleep(ahead)
                if not i & 1023:
                    if time.perf_counter() > deadline:
                        break
                    if refused[0] > seen_refusals:  # the receiver is behind: back off a little
                        seen_refusals = refused[0]
                        await asyncio.sleep(0.002)
            # Send again what was refused (bounded in time), until no new refusals arrive.
            resent = 0
            hard = time.monotonic() + 20
            quiet_since = time.monotonic()
            while time.monotonic() < hard:
                await asyncio.sleep(0.02)
                missing = refused[0] - resent
                if missing <= 0:
                    if time.monotonic() - quiet_since > 0.3:
                        break
                    continue
                quiet_since = time.monotonic()
                for j in range(missing):
                    await send(to, "bench", make_payload(i + j))
                i += missing
                resent += missing
            i -= refused[0]  # accepted by the daemons: the receiver must get exactly these
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
        while me.unsent and time.monotonic() < end:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        drained = time.perf_counter() - t0
        emit({"event": "sent", "sent": i, "elapsed_s": elapsed, "rate": i / elapsed,
              "drained_s": drained, "cpu_us_per_msg": cpu_us})
        await wait_cmd_async()  # "stop": receivers are done, bounces (if any) have arrived
        emit({"event": "result", "sent": i, "elapsed_s": elapsed, "rate": i / elapsed,
              "errors": sum(errors.values()), "error_codes": errors, "send_failed": failed})


async def mesh_echo(cfg: Cfg) -> None:
    async with _agent(cfg) as me:
        def echo(msg: Any) -> Any:
            return msg.payload

        async def echo_async(msg: Any) -> Any:  # the README's way: an ``async def`` handler
            return msg.payload

        me.on("rr")(echo if cfg.get("sync_handler") else echo_async)

        emit({"event": "ready"})
        await wait_cmd_async()
        emit({"event": "result"})


async def mesh_rtt(cfg: Cfg) -> None:
    async with _agent(cfg) as me:
        await _wait_known(me, cfg["to"])
        emit({"event": "ready"})
        await wait_cmd_async()
        samples: list[int] = []
        for i in timed(cfg, samples):
            await me.request(cfg["to"], "rr", make_payload(i), timeout=5)
        emit_latency(samples)


async def mesh_pub(cfg: Cfg) -> None:
    topic = cfg["topic"]
    n_subs = int(cfg["subscribers"])
    async with _agent(cfg) as me:
        # Warm up until the publisher's daemon counts every subscriber and the SUB sockets have
        # had time to pass their subscriptions to its XPUB (counted separately by subscribers).
        end = time.monotonic() + 15
        reached = 0
        while time.monotonic() < end:
            reached = await me.publish(topic, {"warm": 1}, reach=True)
            if reached >= n_subs:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        for _ in range(20):
            await me.publish(topic, {"warm": 1})
        emit({"event": "ready", "reached": reached})
        await wait_cmd_async()
        window = int(cfg["window"])
        max_n = int(cfg["max_n"])
        deadline = time.perf_counter() + float(cfg["duration"])
        t0 = time.perf_counter()
        i = 0
        counts: dict[int, int] = {}
        failures = 0
        publish = me.publish
        while window == 1 and i < max_n:  # the README's way: a plain awaited loop
            try:
                got = await publish(topic, make_payload(i))
                reach = got if isinstance(got, int) else -1  # -1: this API gave no reach count
                counts[reach] = counts.get(reach, 0) + 1
            except Exception:
                failures += 1
            i += 1
            if not i & 255 and time.perf_counter() > deadline:
                break
        while window > 1 and i < max_n and time.perf_counter() < deadline:
            k = min(window, max_n - i)
            results = await asyncio.gather(
                *(me.publish(topic, make_payload(i + j), reach=True) for j in range(k)),
                return_exceptions=True,
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
        await wait_cmd_async()
        emit({"event": "result", "sent": i, "errors": me.errors_received + failures})


# ================================================================= raw local protocol (c', d', e, f)

def _wire_connect(cfg: Cfg, linger: int) -> Socket:
    """A DEALER on the daemon's ipc socket, registered under cfg['name'] (REGISTER kind)."""
    sock = zsocket(zmq.DEALER, linger=linger, SNDHWM=10_000, RCVHWM=10_000, SNDTIMEO=5000)
    sock.connect(f"ipc://{cfg['socket']}")
    _wire_call(sock, {"kind": "register"}, {"name": cfg["name"], "capabilities": [], "metadata": {}})
    return sock


_wire_seq = iter(range(1, 1 << 62))


def _wire_call(sock: Socket, header: dict[str, Any], body: Any = None) -> tuple[dict[str, Any], Any]:
    """A daemon-addressed control call: send, wait (bounded) for the ok; (ok header, decoded body)."""
    msg_id = f"w{os.getpid():x}-{next(_wire_seq)}"
    header = dict(header, id=msg_id)
    sock.send_multipart([SIG, msgpack.packb(header), msgpack.packb(body) if body is not None else b""])
    end = time.monotonic() + 5
    while time.monotonic() < end:
        if not sock.poll(100):
            continue
        frames = sock.recv_multipart()
        h = unpack(frames[1])
        if h.get("corr") != msg_id:
            continue
        if h.get("kind") == "error":
            raise RuntimeError(f"daemon refused {header['kind']}: {h.get('error')}")
        return h, (unpack(frames[2]) if frames[2] else None)
    raise TimeoutError(f"no answer to {header['kind']}")


def _wire_wait_known(sock: Socket, to: str, timeout: float = 15.0) -> None:
    """Wait (bounded; a missing receiver then shows as losses) until the directory lists ``to``."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(a.get("name") == to for a in _wire_call(sock, {"kind": "query", "what": "agents"})[1]):
            return
        time.sleep(0.02)


def _wire_warm_publish(sock: Socket, cfg: Cfg, timeout: float = 15.0) -> int:
    """Publish warm-ups until the daemon counts every subscriber; returns the last count."""
    header = {"kind": "publish", "topic": cfg["topic"], "from": cfg["name"]}
    end = time.monotonic() + timeout
    reached = 0
    while time.monotonic() < end:
        reached = int(_wire_call(sock, header, {"warm": 1})[0].get("count", 0))
        if reached >= int(cfg["subscribers"]):
            time.sleep(0.3)  # SUB subscriptions travel to the XPUB on their own
            for _ in range(20):
                _wire_call(sock, header, {"warm": 1})
            break
        time.sleep(0.02)
    return reached


class Heartbeat:
    """A tick that sends the agent heartbeat when HEARTBEAT_S has passed since the last one."""

    def __init__(self, sock: Socket) -> None:
        self.sock = sock
        self.last = time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.last > HEARTBEAT_S:
            self.beat()

    def beat(self) -> None:
        with contextlib.suppress(zmq.Again):
            self.sock.send_multipart([SIG, msgpack.packb({"kind": "agent_hb"}), msgpack.packb({})],
                                     zmq.NOBLOCK)
        self.last = time.monotonic()


def _wire_batches(cfg: Cfg) -> list[Frames]:
    """8 distinct pre-encoded batches (fresh ids and payloads inside each), sent in a cycle.

    [SIG, batch header, body]: the body is one msgpack array of [header, payload] pairs, exactly as
    the client builds them; to an agent (``to``) or published on ``topic``.
    """
    to, topic, batch = cfg.get("to"), cfg.get("topic"), int(cfg["batch"])
    dest = {"to": to} if topic is None else {"topic": topic}
    inner: dict[str, Any] = {"kind": "send", "topic": "bench"} if topic is None else {"kind": "publish"}
    batches = []
    for b in range(8):
        items: list[list[Any]] = [[{**inner, "id": f"m{i}"}, pack(make_payload(i))]
                                  for i in range(b * batch, (b + 1) * batch)]
        batches.append([SIG, msgpack.packb({"kind": "batch", "id": f"b{b}", "from": cfg["name"], **dest,
                                            "count": batch}), pack(items)])
    return batches


def wire_send(cfg: Cfg) -> None:
    """Raw DEALER speaking the local protocol: pre-encoded batches [SIG, batch-hdr, body]."""
    sock = _wire_connect(cfg, linger=5000)  # linger: the tail still goes out at close
    batch = int(cfg["batch"])
    reached = 0
    if cfg.get("topic") is None:
        _wire_wait_known(sock, cfg["to"])
    else:  # publish mode
        reached = _wire_warm_publish(sock, cfg)
    batches = _wire_batches(cfg)
    emit({"event": "ready", "reached": reached})
    wait_cmd()
    errors: dict[str, int] = {}
    acks: dict[int, int] = {}
    refused = 0  # messages the daemon refused (INBOX_FULL): a well-behaved sender sends them again

    def on_reply(frames: Frames) -> None:
        nonlocal refused
        h = unpack(frames[1])
        if h.get("kind") == "error":
            code = (h.get("error") or {}).get("code", "?")
            errors[code] = errors.get(code, 0) + 1
            if code == "INBOX_FULL":
                refused += len(h.get("ids") or [1])
                time.sleep(0.001)  # back off, as the retry hint asks
        elif h.get("kind") == "ok" and "count" in h:
            acks[h["count"]] = acks.get(h["count"], 0) + 1

    heartbeat = Heartbeat(sock)
    max_batches = int(cfg["max_n"]) // batch
    deadline = time.perf_counter() + float(cfg["duration"])
    t0 = time.perf_counter()
    n = 0
    try:
        while n < max_batches:
            sock.send_multipart(batches[n & 7])
            n += 1
            if not n & 63:
                if time.perf_counter() > deadline:
                    break
                drain(sock, on_reply)
                heartbeat()
    except zmq.Again:
        pass
    # Make up for what was refused (INBOX_FULL), as a real client would, within a bounded time.
    resent = 0
    hard_resend = time.monotonic() + 20
    while time.monotonic() < hard_resend:
        drain(sock, on_reply)
        if refused - resent < batch:
            time.sleep(0.02)
            drain(sock, on_reply)
            if refused - resent < batch:
                break
        try:
            sock.send_multipart(batches[n & 7], zmq.NOBLOCK)
        except zmq.Again:
            time.sleep(0.001)
            continue
        n += 1
        resent += batch
    elapsed = time.perf_counter() - t0
    sent = n * batch - refused  # accepted by the daemon; the receiver must get exactly these
    emit({"event": "sent", "sent": sent, "elapsed_s": elapsed, "rate": sent / elapsed})
    # Wait for "stop", heartbeating and collecting any bounces meanwhile.
    serve({sock: on_reply}, tick=heartbeat, hard_s=30)
    drain(sock, on_reply)
    emit({"event": "result", "sent": sent, "elapsed_s": elapsed, "rate": sent / elapsed,
          "errors": sum(errors.values()), "error_codes": errors,
          "acks": {str(k): v for k, v in acks.items()}})


def wire_recv(cfg: Cfg) -> None:
    """Raw DEALER registered as an agent: decodes each payload (like raw_sink), counts."""
    sock = _wire_connect(cfg, linger=0)
    emit({"event": "ready"})
    unpackb = msgpack.unpackb

    def measure(frames: Frames) -> int:
        kind = unpackb(frames[1], raw=False).get("kind")
        if kind == "batch":
            pairs = unpackb(frames[2], raw=False)
            for _h, p in pairs:
                unpackb(p, raw=False)
            return len(pairs)
        if kind == "send":
            unpackb(frames[2], raw=False)
            return 1
        return 0

    count_until_told(sock, measure, tick=Heartbeat(sock))


def wire_echo(cfg: Cfg) -> None:
    """Raw DEALER registered as an agent that answers each request with a reply (local protocol)."""
    sock = _wire_connect(cfg, linger=0)
    me = cfg["name"]
    emit({"event": "ready"})
    answered = 0

    def answer(frames: Frames) -> None:
        nonlocal answered
        h = unpack(frames[1])
        if h.get("kind") != "request":
            return
        obj = unpack(frames[2])
        answered += 1
        reply = {"kind": "reply", "id": f"r{answered}", "corr": h["id"], "topic": h.get("topic"),
                 "from": me, "to": h["from"]}
        sock.send_multipart([SIG, msgpack.packb(reply), pack(obj)])

    serve({sock: answer}, tick=Heartbeat(sock))
    emit({"event": "result", "answered": answered})


def wire_rtt(cfg: Cfg) -> None:
    """Raw DEALER requester in the local protocol: encode header+payload, send, wait for the reply."""
    sock = _wire_connect(cfg, linger=0)
    to, me = cfg["to"], cfg["name"]
    _wire_wait_known(sock, to)
    sock.setsockopt(zmq.RCVTIMEO, 5000)
    emit({"event": "ready"})
    wait_cmd()
    samples: list[int] = []
    with contextlib.suppress(zmq.Again):
        for i in timed(cfg, samples, between=Heartbeat(sock)):
            msg_id = f"q{i}"
            header = {"kind": "request", "id": msg_id, "topic": "rr", "from": me, "to": to,
                      "budget": 5000}  # ms left: a duration (clocks differ between hosts)
            sock.send_multipart([SIG, msgpack.packb(header), pack(make_payload(i))])
            while True:
                frames = sock.recv_multipart()
                if unpack(frames[1]).get("corr") == msg_id:
                    unpack(frames[2])
                    break
    emit_latency(samples)


# ========================================================================================== dispatch

ROLES: dict[str, Callable[[Cfg], Any]] = {
    "raw_sink": raw_sink, "raw_source": raw_source, "raw_echo": raw_echo, "raw_rtt": raw_rtt,
    "raw_relay": raw_relay, "raw_echo_dealer": raw_echo_dealer,
    "mesh_recv": mesh_recv, "mesh_send": mesh_send, "mesh_echo": mesh_echo, "mesh_rtt": mesh_rtt,
    "mesh_pub": mesh_pub,
    "wire_send": wire_send, "wire_recv": wire_recv, "wire_echo": wire_echo, "wire_rtt": wire_rtt,
}


def otel_mode(mode: str | None) -> None:
    """A helper's OpenTelemetry set-up (bench/tracing_row.py): ``absent`` makes the API
    unimportable (as without the ``otel`` extra), ``api`` leaves it importable with no SDK, ``sdk``
    configures the SDK with a batch processor and an exporter that drops every span."""
    if mode is None:
        return
    if mode == "absent":
        from meshd.client import tracing

        tracing.API = False  # what the client does when the import fails
    elif mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Drop(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)


def run_role(name: str, cfg: Cfg) -> None:
    """Run one helper role. Async (Agent) roles run under the hard timeout; sync ones bound every
    wait themselves. Every socket made by zsocket is closed on the way out."""
    otel_mode(cfg.get("otel"))
    if name in ROLES:
        role = ROLES[name]
    elif name.startswith("emb_"):  # an agent with its node embedded (roles_embedded.py)
        from roles_embedded import EMBEDDED_ROLES

        role = EMBEDDED_ROLES[name]
    else:  # NATS, Zenoh, raw PUB/SUB (imported only by the helpers that need them)
        from roles_peers import PEER_ROLES

        role = PEER_ROLES[name]
    try:
        if inspect.iscoroutinefunction(role):
            asyncio.run(asyncio.wait_for(role(cfg), HELPER_HARD_TIMEOUT))
        else:
            role(cfg)
    finally:
        if _context.cache_info().currsize:
            _context().destroy()
