"""Fuzz campaign: generated frames at a live daemon's agent socket and mesh
ports, plaintext and CURVE, while an agent pair keeps doing normal requests through it.

Frames come from bench/fuzz_gen.py: a pool of hypothesis examples drawn once, then mutated with
a seeded ``random`` (fast: the daemon is the bottleneck, not the generator). Targets:

* the agent socket of the plaintext daemon, from a connection that never registers: every frame
  set whose header shows a string ``id`` must be answered with that ``corr`` (docs/PROTOCOL.md
  §7.1; ``fuzz_gen.expected_corrs``); ``register`` frame sets go on a second, unchecked
  connection (registering changes what later frames get);
* each daemon's mesh ROUTER (plaintext, and CURVE with the fuzzer's key trusted), half from a
  connection that never greets and half from a fake peer that sent a valid HELLO first (so the
  frames reach the routing path, not only the pre-HELLO drop); nothing there is answered to the
  fuzzer's connection, so the check is that the daemon lives and keeps serving.

Reported, one line: frames per target, addressable/answered/unanswered, crashes (daemon gone, or
an exit code other than 0 on SIGTERM), tracebacks in the daemon logs, guarded input errors
(``agent_input_errors``: exceptions the last guard in routing.py caught), normal requests ok and
failed, and each daemon's RSS at the start, peak and end (sampled every 0.5 s).

    nice -n 10 .venv/bin/python bench/fuzz.py --frames 100000 --mesh-frames 100000

A short run of the same code is in tests/integration/test_fuzz_short.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ and the checkout on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import msgpack
import zmq

from meshd import Agent
from meshd.mesh.keys import trust_key
from meshd.util.daemon_process import DaemonProcess
from meshd.wire import protocol as P

try:
    import fuzz_gen as G
except ImportError:  # loaded by file path (the in-suite short run)
    import importlib.util
    _gen_path = Path(__file__).resolve().parent / "fuzz_gen.py"
    _spec = importlib.util.spec_from_file_location("fuzz_gen", _gen_path)
    assert _spec is not None and _spec.loader is not None
    G = importlib.util.module_from_spec(_spec)
    sys.modules["fuzz_gen"] = G
    _spec.loader.exec_module(G)

WINDOW = 200
"""Addressable frame sets in flight at most (the daemon's answer lane keeps 1,000 per connection)."""
ANSWER_WAIT_S = 15.0
FAKE_NODE = "fzpeer0000000000"
MAX_FRAME = P.DEFAULT_MAX_PAYLOAD_BYTES + P.BATCH_OVERHEAD + 4096
"""The daemon's MAXMSGSIZE: a larger frame closes the connection it came on, unanswered, with
what was in flight on it (docs/PROTOCOL.md §2): such frame sets go on the unchecked connection."""


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class RssWatch(threading.Thread):
    """The daemon's RSS every 0.5 s: start (after warm-up), peak, end."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.stop = pid, threading.Event()
        self.start_kib = self.peak_kib = self.end_kib = _rss_kib(pid)

        self.steps: list[int] = []  # RSS after each fifth of each target's frames

    def run(self) -> None:
        while not self.stop.wait(0.5):
            self.sample()

    def sample(self) -> int:
        rss = _rss_kib(self.pid)
        if rss:
            self.peak_kib, self.end_kib = max(self.peak_kib, rss), rss
        return rss

    def step(self, i: int, n: int) -> None:
        if n >= 5 and (i + 1) % (n // 5) == 0:
            self.steps.append(self.sample() // 1024)


class Traffic(threading.Thread):
    """Normal service throughout: one agent asks another, over and over."""

    def __init__(self, socket: Path) -> None:
        super().__init__(daemon=True)
        self.socket, self.ok, self.failed, self.stop = socket, 0, 0, threading.Event()
        self.errors: Counter[str] = Counter()
        self.running = threading.Event()

    def run(self) -> None:
        async def loop() -> None:
            async with Agent("fz-echo", socket=self.socket) as echo, \
                    Agent("fz-ask", socket=self.socket) as ask:
                echo.on("ping")(lambda m: m.payload)
                while not self.stop.is_set():
                    try:
                        sent = {"t": time.time(), "n": self.ok}
                        got = await ask.request("fz-echo", "ping", sent, timeout=10)
                        if got == sent:
                            self.ok += 1
                        else:
                            self.failed += 1
                            self.errors["wrong_answer"] += 1
                    except Exception as exc:
                        self.failed += 1
                        self.errors[type(exc).__name__] += 1
                    self.running.set()
                    await asyncio.sleep(0.01)
        asyncio.run(loop())


def _corr(frames: list[bytes]) -> str | None:
    try:
        corr = msgpack.unpackb(frames[1], raw=False, strict_map_key=False).get("corr")
    except Exception:
        return None
    return corr if isinstance(corr, str) else None


class AgentTarget:
    """Fuzz the agent socket; count what must be answered and what was."""

    def __init__(self, ctx: zmq.Context[Any], endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.ctl = ctx.socket(zmq.DEALER)  # register and oversized frame sets: not checked
        for s in (self.sock, self.ctl):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVHWM, 100_000)
            s.connect(endpoint)
        self.expected: Counter[str] = Counter()
        self.answered: Counter[str] = Counter()
        self.outstanding = 0
        self.samples: dict[str, list[bytes]] = {}

    def drain(self) -> None:
        while self.sock.poll(0):
            corr = _corr(self.sock.recv_multipart())
            if corr is not None:
                self.answered[corr] += 1
                if self.answered[corr] <= self.expected[corr]:
                    self.outstanding -= 1
        while self.ctl.poll(0):
            self.ctl.recv_multipart()

    def send(self, frames: list[bytes]) -> None:
        corrs = G.expected_corrs(frames)
        if corrs is None or max(map(len, frames)) > MAX_FRAME:
            self.ctl.send_multipart(frames)
        else:
            self.sock.send_multipart(frames)
            for corr in corrs:
                self.expected[corr] += 1
                self.outstanding += 1
                if len(self.samples) < 10_000:
                    self.samples[corr] = frames
        self.drain()
        end = time.monotonic() + ANSWER_WAIT_S
        while self.outstanding > WINDOW and time.monotonic() < end:
            if self.sock.poll(100):
                self.drain()

    def finish(self) -> dict[str, Any]:
        end = time.monotonic() + ANSWER_WAIT_S
        while self.outstanding > 0 and time.monotonic() < end:
            if self.sock.poll(200):
                self.drain()
        missing = {c: n - self.answered[c] for c, n in self.expected.items() if self.answered[c] < n}
        self.sock.close(0)
        self.ctl.close(0)
        return {"addressable": sum(self.expected.values()),
                "answered": sum(self.expected.values()) - sum(missing.values()),
                "unanswered": sum(missing.values()),
                "unanswered_samples": [_describe(self.samples.get(c, [])) for c in sorted(missing)[:5]]}


def _describe(frames: list[bytes]) -> str:
    try:
        head = repr(P.unpack_header(frames[1]))[:200] if len(frames) > 1 else "-"
    except Exception as exc:
        head = f"<{exc}>"
    return f"{len(frames)} frames, sig {frames[0][:8]!r} header {head}" if frames else "?"


class RegisteredTarget:
    """Fuzz the agent socket from a connection registered as ``fz-fuzz``: its frames pass the
    registration check and reach routing, the qos-1 outbox, batches and the live agents' client
    library. What it is answered is drained, not checked (what a registered sender is owed
    depends on the directory and on the agents)."""

    NAME = "fz-fuzz"

    def __init__(self, ctx: zmq.Context[Any], endpoint: str) -> None:
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 100_000)
        self.sock.connect(endpoint)
        self.received = 0
        self.register()

    def register(self) -> None:
        self.sock.send_multipart(P.frames({P.KIND: P.Kind.REGISTER, P.ID: "fz-reg"},
                                          P.pack({"name": self.NAME})))
        end = time.monotonic() + 10
        while time.monotonic() < end and self.sock.poll(200):
            if _corr(self.sock.recv_multipart()) == "fz-reg":
                return
        raise RuntimeError("the fuzzing connection could not register")

    def send(self, i: int, frames: list[bytes]) -> None:
        if max(map(len, frames)) > MAX_FRAME:
            return  # it would close this connection (the unchecked one above covers that)
        if i % 1000 == 999:  # a fuzzed unregister may have dropped the name
            self.sock.send_multipart(P.frames({P.KIND: P.Kind.REGISTER, P.ID: P.new_id()},
                                              P.pack({"name": self.NAME})))
        self.sock.send_multipart(frames)
        while self.sock.poll(0):
            self.sock.recv_multipart()
            self.received += 1

    def close(self) -> None:
        self.sock.close(0)


class MeshTarget:
    """Fuzz a mesh ROUTER: a connection that never greets, and a fake peer that did."""

    def __init__(self, ctx: zmq.Context[Any], d: DaemonProcess, endpoint: str,
                 curve: tuple[bytes, bytes, bytes] | None) -> None:
        self.ctx, self.d, self.endpoint, self.curve = ctx, d, endpoint, curve
        self.stranger = self._dealer(b"f" * 16)
        self.peer_rid = f"{FAKE_NODE}.{uuid.uuid4().hex[:6]}".encode()
        self.peer = self._dealer(self.peer_rid)
        self.inbox = ctx.socket(zmq.ROUTER)  # where the daemon dials the fake peer back
        self.inbox.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            self.inbox.curve_server = True
            self.inbox.curve_secretkey = curve[1]
        port = self.inbox.bind_to_random_port("tcp://127.0.0.1")
        self.router = f"tcp://127.0.0.1:{port}"
        self.received = 0
        self.hellos = 0

    def _dealer(self, rid: bytes) -> zmq.Socket[Any]:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IDENTITY, rid)
        if self.curve is not None:
            s.curve_publickey, s.curve_secretkey, s.curve_serverkey = self.curve
        s.connect(self.endpoint)
        return s

    def hello(self) -> None:
        body = {"node": FAKE_NODE, "name": "fuzzer", "mesh": self.d.mesh, "proto": P.PROTOCOL_VERSION,
                "routers": [self.router], "pubs": [], "incarnation": "fz1", "dir": {}}
        if self.curve is not None:
            body["pk"] = self.curve[0].decode()
        self.peer.send_multipart(P.frames({P.KIND: P.Kind.HELLO, P.ID: P.new_id(), P.FROM: FAKE_NODE,
                                           P.SEQ: self.hellos + 1}, P.pack(body)))
        self.hellos += 1

    def send(self, i: int, frames: list[bytes]) -> None:
        if i % 100 == 0:  # a fuzzed bye or hello may have un-greeted it
            self.hello()
        (self.peer if i % 2 else self.stranger).send_multipart(frames)
        while self.inbox.poll(0):
            self.inbox.recv_multipart()
            self.received += 1

    def close(self) -> None:
        for s in (self.stranger, self.peer, self.inbox):
            s.close(0)


def _log_tracebacks(d: DaemonProcess) -> int:
    return d.log_tail(0).count("Traceback (most recent call last)")


def _node_info(socket: Path) -> dict[str, Any]:
    async def ask() -> dict[str, Any]:
        async with Agent(f"fz-probe-{uuid.uuid4().hex[:6]}", socket=socket) as me:
            return dict(await me.node_info())
    return asyncio.run(ask())


def _settled_stats(socket: Path, limit_s: float = 60.0) -> dict[str, Any]:
    """The daemon's counters once two reads 0.3 s apart agree (its mesh queue is worked off)."""
    last: dict[str, Any] = {}
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        stats = dict(_node_info(socket)["stats"])
        if stats.get("malformed") == last.get("malformed") and stats.get("dropped_before_hello") == \
                last.get("dropped_before_hello"):
            return stats
        last = stats
        time.sleep(0.3)
    return last


def run_campaign(frames: int, mesh_frames: int, seed: int = 1, workdir: Path | None = None,
                 pool_size: int = 2000, registered_frames: int | None = None) -> dict[str, Any]:
    """Fuzz a plaintext daemon (agent socket + mesh port) and a CURVE one (mesh port, with a
    trusted key); returns the figures."""
    base = workdir or Path(tempfile.mkdtemp(prefix="mfz-", dir="/tmp"))
    registered_frames = frames // 2 if registered_frames is None else registered_frames
    t0 = time.monotonic()
    pool = G.draw_pool(pool_size, seed)
    results: dict[str, Any] = {"pool": len(pool), "pool_s": round(time.monotonic() - t0, 1),
                               "frames_agent": 0, "frames_agent_registered": 0, "frames_mesh_plain": 0,
                               "frames_mesh_curve": 0,
                               "addressable": 0, "answered": 0, "unanswered": 0, "crashes": 0,
                               "tracebacks": 0, "guarded_errors": 0, "answers_dropped": 0,
                               "requests_ok": 0, "requests_failed": 0}
    ctx: zmq.Context[Any] = zmq.Context()
    public, secret = zmq.curve_keypair()
    for secure in (False, True):
        label = "curve" if secure else "plain"
        d = DaemonProcess(f"fz{int(secure)}", f"fz{uuid.uuid4().hex[:8]}", base / f"d{int(secure)}",
                          args=["--interface", "127.0.0.1", "--no-discovery"], insecure=not secure)
        if secure:
            trust_key(d.state_dir / "authorized_keys", "fuzzer", public.decode())
        d.start()
        traffic = Traffic(d.socket)
        rss = None
        try:
            d.wait_ready()
            traffic.start()
            traffic.running.wait(30)
            rss = RssWatch(d.pid)
            rss.start()
            t1 = time.monotonic()
            if not secure:
                agent = AgentTarget(ctx, f"ipc://{d.socket}")
                gen = G.Mutator(pool, seed)
                for i in range(frames):
                    agent.send(gen.next())
                    rss.step(i, frames)
                results.update({k: results[k] + v if isinstance(v, int) else v
                                for k, v in agent.finish().items()})
                results["frames_agent"] = frames
                results["agent_s"] = round(time.monotonic() - t1, 1)
                results["answers_dropped_agent"] = _node_info(d.socket)["stats"].get("answers_dropped", 0)
                t1 = time.monotonic()
                registered = RegisteredTarget(ctx, f"ipc://{d.socket}")
                gen = G.Mutator(pool, seed + 3, targets=["fz-echo", "fz-ask", "nobody", "fz-fuzz"],
                                sender=RegisteredTarget.NAME)
                for i in range(registered_frames):
                    registered.send(i, gen.next())
                    rss.step(i, registered_frames)
                registered.close()
                results["frames_agent_registered"] = registered_frames
                results["agent_registered_s"] = round(time.monotonic() - t1, 1)
            t2 = time.monotonic()
            info = _node_info(d.socket)
            server = info["public_key"] if secure else None
            mesh = MeshTarget(ctx, d, str(info["routers"][0]),
                              (public, secret, server.encode()) if server else None)
            targets = ["fz-echo", "fz-ask", f"fz-echo@{info['node']}"]
            gen = G.Mutator(pool, seed + 1 + secure, targets=targets)
            for i in range(mesh_frames):
                mesh.send(i, gen.next())
                rss.step(i, mesh_frames)
            mesh.close()
            stats = _settled_stats(d.socket)  # the daemon has worked through what was queued
            results[f"frames_mesh_{label}"] = mesh_frames
            results[f"mesh_{label}_s"] = round(time.monotonic() - t2, 1)
            results["guarded_errors"] += stats.get("agent_input_errors", 0)
            # Past the agent phase, dropped answers are those the fake peer's replies and errors
            # flooded at the live agents, past their answer lane (in_flight_max, docs/PROTOCOL.md §8.2).
            results["answers_dropped"] += stats.get("answers_dropped", 0)
            results[f"malformed_{label}"] = stats.get("malformed", 0)
            results[f"peer_greeted_{label}"] = mesh.received > 0
            traffic.stop.set()
            traffic.join(15)
        finally:
            traffic.stop.set()
            alive = d.alive()
            code = d.stop() if alive else d.exited()
            results["crashes"] += (not alive) or code != 0
            if rss is not None:
                rss.stop.set()
                results[f"rss_kib_{label}"] = f"{rss.start_kib}/{rss.peak_kib}/{rss.end_kib}"
                results[f"rss_mib_steps_{label}"] = "/".join(map(str, rss.steps))
            results["tracebacks"] += _log_tracebacks(d)
            results["requests_ok"] += traffic.ok
            results["requests_failed"] += traffic.failed
            if traffic.errors:
                results[f"request_errors_{label}"] = dict(traffic.errors)
    ctx.term()
    results["frames"] = sum(results[k] for k in ("frames_agent", "frames_agent_registered",
                                                 "frames_mesh_plain", "frames_mesh_curve"))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="frames at the agent socket")
    parser.add_argument("--registered-frames", type=int, default=None,
                        help="frames from a registered connection (default: half of --frames)")
    parser.add_argument("--mesh-frames", type=int, default=100_000, help="frames at each mesh port")
    parser.add_argument("--pool", type=int, default=3000, help="hypothesis examples drawn once")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    t0 = time.monotonic()
    results = run_campaign(args.frames, args.mesh_frames, args.seed, pool_size=args.pool,
                           registered_frames=args.registered_frames)
    results["seconds"] = round(time.monotonic() - t0, 1)
    print(" ".join(f"{k}={v}" for k, v in results.items() if k != "unanswered_samples"))
    for sample in results.get("unanswered_samples", []):
        print("  unanswered:", sample)
    print(json.dumps(results), file=sys.stderr)
    ok = (results["crashes"] == 0 and results["unanswered"] == 0 and results["requests_failed"] == 0
          and results["tracebacks"] == 0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
