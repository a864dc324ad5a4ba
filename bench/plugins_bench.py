"""Request p50 through two daemons with a CPU-bound plugin loaded: none vs thread mode vs process mode.

Owns: this one comparison (does process isolation keep a busy plugin from slowing routing?). It
does not touch bench.py's scenarios; it reuses meshd.testing's daemon launcher (127.0.0.1 only, a
mesh named per run, every daemon killed by PID at the end).

Each scenario starts daemons A and B (A with the plugin, configured through ``[plugins.cpu_hog]``),
attaches "asker" to A and "helper" (an ``async def`` handler) to B, warms up, then times plain
awaited requests with a fresh payload each, for a bounded time. The plugin's
``meshd_collaboration`` computes for about ``--hook-ms`` milliseconds in pure Python per outcome
(so it holds the interpreter lock while it runs, like any pure-Python work).

    .venv/bin/python bench/plugins_bench.py            # ~35-45 s
    .venv/bin/python bench/plugins_bench.py --seconds 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from meshd import Agent
from meshd.testing import MeshdFactory, short_tempdir, wait_listed

HOG = """
    import time
    from meshd.hookspecs import hookimpl

    BUSY_S = {busy_s!r}

    @hookimpl
    def meshd_collaboration(outcome):
        end = time.perf_counter() + BUSY_S
        n = 0
        while time.perf_counter() < end:  # pure Python, holds the interpreter lock
            for i in range(200):
                n += i * i
"""


async def _measure(a_socket: Path, b_socket: Path, seconds: float, warmup: int) -> dict[str, Any]:
    async with Agent("helper", socket=b_socket) as helper, Agent("asker", socket=a_socket) as asker:
        @helper.on("q")
        async def answer(message: Any) -> Any:
            return {"seq": message.payload["seq"]}

        await wait_listed(asker, "helper")
        for i in range(warmup):
            await asker.request("helper", "q", {"seq": i, "body": "x" * 252}, timeout=5)
        samples: list[float] = []
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end and i < 200_000:
            i += 1
            t0 = time.perf_counter()
            reply = await asker.request("helper", "q", {"seq": i, "body": "x" * 252}, timeout=5)
            samples.append((time.perf_counter() - t0) * 1e6)
            assert reply == {"seq": i}
    samples.sort()
    return {"n": len(samples), "p50_us": statistics.median(samples),
            "p99_us": samples[min(len(samples) - 1, int(len(samples) * 0.99))]}


def _scenario(mode: str, seconds: float, busy_s: float, warmup: int) -> dict[str, Any]:
    workdir = short_tempdir("mshdpb-")
    factory = MeshdFactory(workdir, mesh=f"bench{os.urandom(4).hex()}")
    try:
        args: list[str] = []
        env: dict[str, str] = {}
        if mode != "none":
            site = workdir / "site"
            site.mkdir()
            (site / "cpu_hog.py").write_text(textwrap.dedent(HOG.format(busy_s=busy_s)))
            conf = workdir / "a.toml"
            conf.write_text(f'[plugins]\nmodules = ["cpu_hog"]\n\n[plugins.cpu_hog]\nisolation = "{mode}"\n'
                            "queue_size = 1000\n")
            args, env = ["--config", str(conf)], {"PYTHONPATH": str(site)}
        a = factory.spawn("a", *args, fast=False, env=env)
        b = factory.spawn("b", fast=False)
        factory.wait_mesh([a, b])
        result = asyncio.run(_measure(a.socket, b.socket, seconds, warmup))
        result["plugin_stats"] = a.query("node")["plugins"]["stats"]
        a.stop()
        b.stop()
        return result
    finally:
        factory.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0, help="timed requests per scenario (s)")
    parser.add_argument("--hook-ms", type=float, default=2.0, help="CPU time the plugin spends per outcome")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, Any]] = {}
    for mode in ("none", "thread", "process"):
        results[mode] = _scenario(mode, min(args.seconds, 15.0), args.hook_ms / 1000, args.warmup)
    base = results["none"]["p50_us"]
    print(f"request p50 through two daemons, CPU-bound plugin ({args.hook_ms:g} ms per outcome) on A")
    print(f"{'plugin':<16}{'requests':>10}{'p50 us':>10}{'p99 us':>10}{'x none':>9}  plugin counters")
    for mode, res in results.items():
        stats = {k: v for k, v in res["plugin_stats"].items() if k.split(":")[0] in ("called", "dropped")}
        label = "no plugin" if mode == "none" else f"{mode} mode"
        print(f"{label:<16}{res['n']:>10}{res['p50_us']:>10.0f}{res['p99_us']:>10.0f}"
              f"{res['p50_us'] / base:>8.2f}x  {stats}")
    ratio = results["process"]["p50_us"] / base
    print(f"goal: process mode within 1.2x of no plugin: {ratio:.2f}x {'met' if ratio <= 1.2 else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
