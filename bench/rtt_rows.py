"""Only the request/reply rows of compare.py, for A/B runs of two checkouts (bench/README.md,
"Request/reply: what the rtt work changed"):

    .venv/bin/python bench/rtt_rows.py --label new --rows mesh,emb,wire,relay,raw

Rows: ``mesh`` (the README's ``await me.request(...)`` loop through two daemons, async echo),
``emb`` (the same between two embedded nodes), ``wire`` (raw-wire agents through the two daemons:
the daemons' share), ``relay`` (2 bare pyzmq relays, 6 hops: the floor), ``raw`` (pyzmq DEALER ->
ROUTER echo, 2 hops). Prints one line ``RESULT {json}`` with each row's p50/p99 in us and the CPU
of each process (main thread and libzmq I/O thread, user and system, from /proc) per round trip.
To compare two checkouts, run it alternately from each (``PYTHONPATH=<checkout>``: the daemons and
helpers it starts inherit it), several pairs, and compare medians. Same safety as compare.py:
127.0.0.1 only, a mesh named for the run, every process stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from compare import Compare
from procs import Daemon, Helper

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid`` ("main" or the thread's name, ``.u``/``.s``)."""
    out: dict[str, float] = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            name = "main" if tid == str(pid) else raw.split("(", 1)[1].rsplit(")", 1)[0]
            fields = raw.rsplit(")", 1)[1].split()
            out[f"{name}.u"] = out.get(f"{name}.u", 0.0) + int(fields[11]) / _TICK
            out[f"{name}.s"] = out.get(f"{name}.s", 0.0) + int(fields[12]) / _TICK
    except (FileNotFoundError, ProcessLookupError, IndexError):
        pass
    return out


class RttRows(Compare):
    def __init__(self, n: int) -> None:
        super().__init__(quick=True, soak_s=1, soak_rate=1000)
        self.rtt_cfg = {"n": n, "warmup": 100, "max_time": 12}
        self.cpu: dict[str, dict[str, dict[str, float]]] = {}

    def _rtt(self, label: str, rtt: Helper, servers: list[Helper],
             daemons: tuple[Daemon, ...] = ()) -> dict[str, Any]:
        """Bench._rtt, reading every process's CPU before the helpers exit."""
        rtt.wait("ready", 30)
        pids = {"asker": rtt.proc.pid, **{f"server{i}": s.proc.pid for i, s in enumerate(servers)},
                **{d.name: d.proc.pid for d in daemons if d.proc is not None}}
        start = {k: thread_cpu(p) for k, p in pids.items()}
        rtt.send(cmd="go")
        res: dict[str, Any] = rtt.wait("result", 40)
        end = {k: thread_cpu(p) for k, p in pids.items()}
        self._end_rtt(rtt, servers)
        count = int(self.rtt_cfg["n"]) + int(self.rtt_cfg["warmup"])
        self.cpu[label] = {k: {t: round((v - start[k].get(t, 0.0)) * 1e6 / count, 1)
                               for t, v in end[k].items() if v > start[k].get(t, 0.0)} for k in pids}
        print(f"  {label}: p50 {res['p50_us']:.0f} us, p99 {res['p99_us']:.0f} us", flush=True)
        return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="run", help="names this checkout in the RESULT line")
    ap.add_argument("--rows", default="mesh,emb", help="comma-separated: mesh, emb, wire, relay, raw")
    ap.add_argument("-n", type=int, default=2000, help="timed requests per row (after 100 warm-up)")
    args = ap.parse_args(argv)
    rows = set(args.rows.split(","))
    bench = RttRows(args.n)
    out: dict[str, Any] = {"label": args.label}
    try:
        if rows & {"mesh", "wire"}:
            a = bench.daemon("A")
            a.start()
            a.wait_ready()
            b = bench.daemon("B")
            asyncio.run(bench.discovery(a, b))
            if "mesh" in rows:
                out["mesh"] = bench.guarded("mesh", bench.readme_rtt, a, b)
            if "wire" in rows:
                out["wire"] = bench.guarded("wire", bench.mesh_rtt, a, b, True)
        if "emb" in rows:
            out["emb"] = bench.guarded("emb", bench.embedded_rtt, "rr")
        if "relay" in rows:
            out["relay"] = bench.guarded("relay", bench.relay_rtt)
        if "raw" in rows:
            out["raw"] = bench.guarded("raw", bench.raw_rtt)
    finally:
        bench.cleanup()
    for key in ("mesh", "wire", "emb", "relay", "raw"):
        res = out.get(key)
        if isinstance(res, dict):
            out[key] = [res.get("p50_us"), res.get("p99_us")]
    out["cpu_us_per_rtt"] = bench.cpu
    print("RESULT", json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
