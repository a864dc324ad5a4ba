"""HTTP gateway bench: a request from a client on daemon A to a Python agent on daemon B and back.

    .venv/bin/python bench/http_bench.py [--n 2000] [--concurrency 8] [--json out.json]

Two rows side by side, in one run, against the same echo agent on B (its own process):
  http   an aiohttp client (keep-alive) POSTs /v1/request to A's gateway; A's in-process HTTP
         agent asks "echo-b" on B and answers the HTTP call with the reply;
  python a meshd.Agent on A asks "echo-b" the same way (the Python client of the README).
Each row: sequential requests (one in flight: p50/p99 latency) and ``--concurrency`` callers at
once (requests per second). Counts and time are bounded (``--n`` per phase, ``MAX_PHASE_S``).
Every process binds 127.0.0.1 only, in a mesh named for this run, and is ended by PID.
bench.py runs it too (``http_rows``), with the daemons it already has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import LOOPBACK, make_payload
from procs import Daemon, end, spawn

MAX_PHASE_S = 10.0
WARMUP = 200


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] * 1e6 if s else float("nan")


def _phase_result(lat: list[float], wall: float) -> dict[str, Any]:
    return {"n": len(lat), "rps": len(lat) / wall if wall else 0.0,
            "p50_us": _pct(lat, 0.50), "p99_us": _pct(lat, 0.99)}


# ---------------------------------------------------------------------------------- roles


async def role_server(cfg: dict[str, Any]) -> None:
    from meshd import Agent

    async with Agent("echo-b", socket=cfg["socket"]) as me:
        @me.on("echo")
        async def echo(msg: Any) -> Any:
            return msg.payload

        print(json.dumps({"event": "ready"}), flush=True)
        await asyncio.to_thread(sys.stdin.read)  # until the orchestrator closes stdin


async def _drive(call: Any, n: int, concurrency: int) -> dict[str, Any]:
    for i in range(min(WARMUP, n)):
        await call(i)
    lat: list[float] = []
    stop_at = time.monotonic() + MAX_PHASE_S
    t0 = time.perf_counter()
    for i in range(n):
        if time.monotonic() > stop_at:
            break
        s = time.perf_counter()
        await call(i)
        lat.append(time.perf_counter() - s)
    seq = _phase_result(lat, time.perf_counter() - t0)
    lat_c: list[float] = []
    per = max(1, n // concurrency)

    async def lane() -> None:
        for i in range(per):
            if time.monotonic() > stop_at + MAX_PHASE_S:
                return
            s = time.perf_counter()
            await call(i)
            lat_c.append(time.perf_counter() - s)

    t0 = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    conc = _phase_result(lat_c, time.perf_counter() - t0)
    return {"sequential": seq, "concurrent": conc | {"callers": concurrency}}


async def role_http(cfg: dict[str, Any]) -> None:
    import aiohttp

    from meshd.gateway.auth import find_gateway

    gw = find_gateway(Path(cfg["socket"]))
    auth = {"Authorization": f"Bearer {gw.token}"}
    conn = aiohttp.TCPConnector(limit=cfg["concurrency"] + 2)
    async with aiohttp.ClientSession(connector=conn, headers=auth) as s:
        async with s.post(gw.url + "v1/agents/register", json={"name": "http-bench-a"}) as r:
            sid = (await r.json())["session_id"]
        beating = True

        async def beat() -> None:
            while beating:
                async with s.post(gw.url + f"v1/agents/{sid}/heartbeat", json={"queue_depth": 0}) as r:
                    await r.read()
                await asyncio.sleep(0.5)
        hb = asyncio.create_task(beat())

        async def call(i: int) -> None:
            body = {"session_id": sid, "target": "echo-b", "topic": "echo", "payload": make_payload(i),
                    "timeout": 10}
            async with s.post(gw.url + "v1/request", json=body) as r:
                if r.status != 200:
                    raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
                await r.read()

        result = await _drive(call, cfg["n"], cfg["concurrency"])
        beating = False
        await hb
    print(json.dumps({"event": "result", **result}), flush=True)


async def role_python(cfg: dict[str, Any]) -> None:
    from meshd import Agent

    async with Agent("py-bench-a", socket=cfg["socket"]) as me:
        async def call(i: int) -> None:
            await me.request("echo-b", "echo", make_payload(i), timeout=10)
        result = await _drive(call, cfg["n"], cfg["concurrency"])
    print(json.dumps({"event": "result", **result}), flush=True)


ROLES = {"server": role_server, "http": role_http, "python": role_python}


# ---------------------------------------------------------------------------------- orchestration


def _run_role(role: str, cfg: dict[str, Any], logdir: Path, timeout: float) -> tuple[Any, dict[str, Any]]:
    proc = spawn([sys.executable, str(Path(__file__).resolve()), "--role", role, "--cfg", json.dumps(cfg)],
                 logdir / f"http-{role}.log", talk=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        event = json.loads(line)
        if event.get("event") in ("ready", "result"):
            return proc, event
    end(proc)
    raise RuntimeError(f"http bench role {role} gave no answer:\n"
                       f"{(logdir / f'http-{role}.log').read_text(errors='replace')[-2000:]}")


def _wait_listed(socket: Path, name: str, timeout: float = 20.0) -> None:
    from meshd import Agent

    async def check() -> None:
        async with Agent(f"http-bench-probe-{uuid.uuid4().hex[:6]}", socket=socket) as probe:
            end_at = time.monotonic() + timeout
            while not any(a["name"] == name for a in await probe.agents()):
                if time.monotonic() > end_at:
                    raise TimeoutError(f"{name} never listed on {socket}")
                await asyncio.sleep(0.05)
    asyncio.run(check())


def http_rows(a: Daemon, b: Daemon, logdir: Path, n: int = 2000, concurrency: int = 8) -> dict[str, Any]:
    """The two rows, with daemons A and B already running (B hosts the echo agent)."""
    server, _ = _run_role("server", {"socket": str(b.socket)}, logdir, 30)
    try:
        _wait_listed(a.socket, "echo-b")
        results: dict[str, Any] = {}
        for role in ("http", "python"):
            proc, event = _run_role(role, {"socket": str(a.socket), "n": n, "concurrency": concurrency},
                                    logdir, 4 * MAX_PHASE_S + 30)
            end(proc, None, 5)
            results[role] = {k: v for k, v in event.items() if k != "event"}
        h, p = results["http"]["sequential"], results["python"]["sequential"]
        results["http_p50_over_python"] = h["p50_us"] / p["p50_us"] if p["p50_us"] else None
        return results
    finally:
        assert server.stdin is not None
        end(server, server.stdin.close, 5)


def print_rows(r: dict[str, Any]) -> None:
    print(f"{'HTTP bench (A -> B -> A)':34} {'seq p50 us':>11} {'seq p99 us':>11} {'seq req/s':>10} "
          f"{'conc req/s':>11} {'conc p50 us':>12}")
    for role, label in (("http", "HTTP /v1/request (keep-alive)"), ("python", "Python client request")):
        s, c = r[role]["sequential"], r[role]["concurrent"]
        print(f"{label:34} {s['p50_us']:11.0f} {s['p99_us']:11.0f} {s['rps']:10.0f} {c['rps']:11.0f} "
              f"{c['p50_us']:12.0f}")
    print(f"HTTP p50 / Python p50 (sequential): {r['http_p50_over_python']:.2f}x; "
          f"concurrent callers: {r['http']['concurrent']['callers']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="requests per phase (bounded by time too)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--role", help=argparse.SUPPRESS)
    ap.add_argument("--cfg", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role:
        asyncio.run(ROLES[args.role](json.loads(args.cfg or "{}")))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="mshh-", dir="/tmp"))
    logdir = workdir / "logs"
    logdir.mkdir()
    mesh = f"httpb{uuid.uuid4().hex[:10]}"
    daemons = [Daemon("A", mesh, workdir), Daemon("B", mesh, workdir)]
    try:
        for d in daemons:
            d.start()
        for d in daemons:
            d.wait_ready()
        results = http_rows(daemons[0], daemons[1], logdir, args.n, args.concurrency)
    finally:
        for d in daemons:
            d.stop()
    print_rows(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    assert LOOPBACK == "127.0.0.1"
    sys.exit(main())
