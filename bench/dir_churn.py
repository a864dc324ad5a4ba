"""Directory churn: what one agent's subscriptions cost the daemon that tells its peers.

    .venv/bin/python bench/dir_churn.py [--subs 10000] [--topic-len 30] [--json out.json]

Two real daemons (a, b) on 127.0.0.1, in a mesh named uniquely for this run. One agent on a
subscribes to ``--subs`` topics (``--in-flight`` awaited together; 1 = a plain awaited loop); then an agent on
b publishes to the last topic until it reaches the subscriber (b's view converged). Printed:
the CPU seconds of daemons a and b for the run (``/proc/<pid>/stat``), the TCP bytes a's
DEALER sent to b's ROUTER (``ss``: directories, heartbeats, everything), and a's directory
counters. Bounded: at most ``--budget`` seconds (default 60), then it
gives up. Both daemons are killed (by PID) when it ends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from meshd import Agent
from meshd.testing import MeshdFactory, MeshdProcess, short_tempdir, wait_listed


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tcp_bytes_to(endpoint: str) -> int:
    """Bytes sent on every TCP connection to ``endpoint`` (tcp://IP:PORT), as ``ss`` counts them."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    out = subprocess.run(["ss", "-tinH", "dst", f"{host}:{port}"], capture_output=True, text=True,
                         timeout=10).stdout
    return sum(int(m) for m in re.findall(r"bytes_sent:(\d+)", out))


async def churn(a: MeshdProcess, b: MeshdProcess, subs: int, topic_len: int, budget: float,
                in_flight: int) -> float:
    topics = [f"{i:06d}." + "t" * max(topic_len - 7, 0) for i in range(subs)]
    end = time.monotonic() + budget
    async with Agent("hoarder", socket=a.socket) as hoarder, Agent("pub", socket=b.socket) as pub:
        await wait_listed(pub, "hoarder")
        start = time.monotonic()
        for i in range(0, subs, in_flight):
            await asyncio.gather(*(hoarder.subscribe(t) for t in topics[i:i + in_flight]))
            if time.monotonic() > end:
                raise SystemExit(f"gave up after {budget:g} s at {i} subscriptions")
        while (await pub.publish(topics[-1], {"last": True}, reach=True) or 0) < 1:
            if time.monotonic() > end:
                raise SystemExit(f"b's view did not converge within {budget:g} s")
            await asyncio.sleep(0.05)
        return time.monotonic() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subs", type=int, default=10_000)
    ap.add_argument("--topic-len", type=int, default=30)
    ap.add_argument("--in-flight", type=int, default=1,
                    help="subscriptions awaited together (1: a plain awaited loop)")
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    env = {"MESHD_MAX_SUBSCRIPTIONS_PER_AGENT": str(max(args.subs, 1))}
    factory = MeshdFactory(short_tempdir("mshd-churn-"))
    try:
        a = factory.spawn("a", env=env)
        b = factory.spawn("b", env=env)
        factory.wait_mesh([a, b])
        cpu0, cpub0, t0 = cpu_seconds(a.pid), cpu_seconds(b.pid), tcp_bytes_to(b.router)
        elapsed = asyncio.run(churn(a, b, args.subs, args.topic_len, args.budget, args.in_flight))
        cpu, cpu_b, tcp = cpu_seconds(a.pid) - cpu0, cpu_seconds(b.pid) - cpub0, tcp_bytes_to(b.router) - t0
        stats = a.query("node").get("stats", {})
        result: dict[str, Any] = {
            "subs": args.subs, "topic_len": args.topic_len, "in_flight": args.in_flight,
            "seconds": round(elapsed, 2),
            "cpu_s_a": round(cpu, 2), "cpu_s_b": round(cpu_b, 2), "tcp_a_to_b": tcp,
            **{k: v for k, v in sorted(stats.items()) if k.startswith("dir")},
        }
        print(json.dumps(result))
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    finally:
        factory.cleanup()


if __name__ == "__main__":
    main()
