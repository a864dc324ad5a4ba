"""What an observer plugin costs: the README's one-way and request/reply rows through two daemons,
with no plugin, with plugins/meshd-prometheus, and with an audit plugin (thread mode) that writes
every ``meshd_collaboration`` outcome to a file, interleaved in one run.

The Prometheus plugin reads the node's own collaboration counts at scrape time (no event per
message); the audit plugin is the case where every single outcome matters, and pays for it.

    .venv/bin/python bench/observer_cost.py            # ~2 min: 2 rounds of 3 setups
    .venv/bin/python bench/observer_cost.py --rounds 1

Each setup is its own mesh of two daemons (A with the plugin, B without) on 127.0.0.1, every
process ended by PID at the end; each run is bounded in count and time (compare.py's bounds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import textwrap
import uuid
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))

from compare import Compare  # noqa: E402

AUDIT = '''
    import json, threading
    from meshd.hookspecs import hookimpl

    _out = open({path!r}, "a", buffering=1 << 16)
    _lock = threading.Lock()

    @hookimpl
    def meshd_collaboration(outcome):
        with _lock:
            _out.write(json.dumps(outcome) + "\\n")
'''


def setups(workdir: Path) -> dict[str, dict[str, str]]:
    audit_dir = workdir / "audit_plugin"
    audit_dir.mkdir(exist_ok=True)
    (audit_dir / "meshd_bench_audit.py").write_text(
        textwrap.dedent(AUDIT.format(path=str(workdir / "audit.jsonl"))))
    prometheus_dir = REPO / "plugins" / "meshd-prometheus"
    base = {"MESHD_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return {
        "no plugin": dict(base),
        "meshd-prometheus": base | {"PYTHONPATH": str(prometheus_dir),
                                    "MESHD_PLUGINS": "meshd_prometheus", "MESHD_PROMETHEUS_PORT": "0"},
        "audit observer (thread)": base | {"PYTHONPATH": str(audit_dir),
                                           "MESHD_PLUGINS": "meshd_bench_audit"},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (1-5)")
    args = ap.parse_args(argv)
    rounds = max(1, min(args.rounds, 5))
    bench = Compare(quick=True, soak_s=1.0, soak_rate=1000.0)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        envs = setups(bench.workdir)
        n = 0
        for _ in range(rounds):
            for label, env in envs.items():
                n += 1
                mesh = f"obs{uuid.uuid4().hex[:8]}"
                a = bench.daemon(f"A{n}", mesh=mesh, env=env)
                b = bench.daemon(f"B{n}", mesh=mesh)
                a.start()
                a.wait_ready()
                seen = asyncio.run(bench.discovery(a, b))
                if "both_ways_ms" not in seen or seen["both_ways_ms"] == float("inf"):
                    raise RuntimeError(f"daemons A{n} and B{n} never saw each other")
                loaded = bench._node_info(a)["plugins"]["loaded"]
                print(f"  [{label}] plugins loaded on A{n}: {loaded}", flush=True)
                if "MESHD_PLUGINS" in env and not loaded:
                    raise RuntimeError(f"{label}: the plugin did not load on A{n}:\n{a.log()}")
                tag = f"o{n}"
                one = bench.readme_one_way(a, b, tag, label=f"[{label}] one-way (async def handler)")
                rtt = bench.readme_rtt(a, b)
                row = results.setdefault(label, {"one_way": [], "p50": [], "p99": [], "cpu_a": []})
                row["one_way"].append(one["rate"])
                row["cpu_a"].append(next(iter(one["daemon_cpu_us_per_msg"].values()), float("nan")))
                row["p50"].append(rtt["p50_us"])
                row["p99"].append(rtt["p99_us"])
                for d in (a, b):
                    d.stop()
    finally:
        bench.cleanup()
    base = statistics.median(results["no plugin"]["one_way"])
    load = os.getloadavg()[0]
    print(f"\nobserver cost ({rounds} round(s), medians; {os.cpu_count()} cores; load {load:.1f})")
    print(f"{'setup':<26} | {'one-way msgs/s':>14} | {'vs none':>7} | {'daemon A us/msg':>15} | "
          f"{'rr p50 / p99 us':>16}")
    for label, row in results.items():
        rate = statistics.median(row["one_way"])
        cpu = statistics.median(row["cpu_a"])
        print(f"{label:<26} | {rate:>14,.0f} | {rate / base:>6.2f}x | {cpu:>15.1f} | "
              f"{statistics.median(row['p50']):>7.0f} / {statistics.median(row['p99']):<7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
