"""Tool-call overhead, bounded (~20 s): the same request sent directly and through the tool path.

Two daemons on 127.0.0.1; agent "llm" on a, agent "echo" on b. Rows (p50/p99 of N sequential
round trips, awaited one at a time, a fresh payload each):
  direct          me.request("echo", ...)                            agent -> a -> b -> agent
  request_agent   me.call_tool("request_agent", ...)                 + a hop to a's system agent,
                                                                     validation, policy checks
  list_agents     me.call_tool("list_agents", {})                    the tool path alone (no remote)
Run: python bench/tools_bench.py [N]
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import time
from typing import Any

from meshd import Agent
from meshd.testing import MeshdFactory, short_tempdir


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(n: int, call: Any) -> list[float]:
    for i in range(20):  # warm-up
        await call(i)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


async def run(a: Any, b: Any, n: int) -> None:
    async with Agent("llm", socket=a.socket) as me, Agent("echo", socket=b.socket) as echo:
        @echo.on("echo")
        async def handle(msg: Any) -> Any:
            return msg.payload

        for _ in range(200):
            if "echo" in {x["name"] for x in await me.agents()}:
                break
            await asyncio.sleep(0.05)
        rows = {
            "direct": await measure(n, lambda i: me.request("echo", "echo", {"i": i}, timeout=10)),
            "request_agent": await measure(n, lambda i: me.call_tool(
                "request_agent", {"agent": "echo", "topic": "echo", "payload": {"i": i}, "timeout_s": 10})),
            "list_agents": await measure(n, lambda i: me.call_tool("list_agents", {})),
        }
    base = statistics.median(rows["direct"])
    print(f"{'path':<14} {'p50 us':>9} {'p99 us':>9} {'x direct':>9}   (N={n})")
    for name, samples in rows.items():
        p50 = statistics.median(samples)
        print(f"{name:<14} {p50:>9.0f} {pct(samples, 0.99):>9.0f} {p50 / base:>9.2f}")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    workdir = short_tempdir("mshd-tb-")
    factory = MeshdFactory(workdir)
    try:
        conf = workdir / "bench.toml"
        conf.write_text("[tools]\ncalls_per_minute = 1000000\n")  # the default quota would stop the run
        a = factory.spawn("a", "--config", str(conf), fast=False)
        b = factory.spawn("b", fast=False)
        factory.wait_mesh([a, b])
        asyncio.run(run(a, b, n))
    finally:
        factory.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
