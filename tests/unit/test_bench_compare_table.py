"""bench/compare_table.py turns a run's results into the side-by-side table with the right verdicts.

No sockets, no timing: the results below are made up, and the checks are on the verdicts and on
what a skipped system or a failed scenario shows. (The harness itself is exercised by running
``bench/compare.py --quick``; it takes about a minute, too long for the test suite.)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def table() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        import compare_table
    finally:
        sys.path.remove(str(BENCH))
    return compare_table


def results(skipped: dict[str, str] | None = None) -> dict[str, Any]:
    def tp(rate: float, lost: int = 0) -> dict[str, Any]:
        return {"rate": rate, "lost_all_runs": lost, "runs": [{"error_codes": {}}]}

    r: dict[str, Any] = {
        "meta": {"skipped": skipped or {}, "payload_bytes": 295, "date": "d", "machine": "m",
                 "loadavg_at_start": [1.0], "loadavg_at_end": [1.0]},
        "mesh_oneway": {**tp(120_000), "daemon_cpu_us_per_msg": {"A": 1.0, "B": 2.0}},
        "nats_oneway": {**tp(100_000), "daemon_cpu_us_per_msg": {"nats-server": 0.5}},
        "zenoh_oneway": tp(200_000),
        "raw_oneway": tp(300_000),
        "mesh_rtt": {"p50_us": 300.0, "p99_us": 900.0},
        "nats_rtt": {"p50_us": 200.0, "p99_us": 400.0},
        "mesh_publish": tp(10_000, lost=3),
        "nats_publish": tp(50_000),
        "idle": {"meshd_agent": {"rss_mib": 20.0, "heavy": []}, "meshd_daemon": {"A": 40.0, "B": 30.0},
                 "nats_server": 14.0},
        "soak": {"rss": {"A": {"growth_after_quarter": 0.5}, "B": {"growth_after_quarter": 3.0}},
                 "achieved": 50_000.0, "seconds": 60},
    }
    for key in list(r):
        if key.split("_")[0] in (skipped or {}):
            del r[key]
    return r


def by_figure(rows: list[list[str]]) -> dict[str, list[str]]:
    return {row[0].strip(): row for row in rows}


def test_verdicts_follow_the_goals(table: Any) -> None:
    rows = by_figure(table.build_rows(results()))
    assert rows["one-way msgs/s (async handler, plain send loop)"][-1] == "yes"  # 1.2x NATS >= 1.0x
    assert rows["one-way msgs/s (async handler, plain send loop)"][5] == "1.20x"
    assert rows["request/reply p50 / p99 us (plain awaited loop)"][-1] == "NO"  # p99 2.25x > 2x
    assert rows["publish to 4 subs, per-sub msgs/s (plain loop)"][-1] == "NO"  # 0.2x < 0.8x
    assert rows["lost (all subscribers)"][-1] == "NO"
    assert rows["lost (all subscribers)"][1] == "3"
    assert rows["idle RSS MiB: agent / client process"][-1] == "yes"
    assert rows["idle RSS MiB: daemons A / B | server"][-1] == "NO"  # 40 > 32
    assert rows["RSS growth MiB under steady load, A / B"][-1] == "NO"  # B grew 3 MiB
    assert rows["daemon-side modules the agent imports"][-1] == "yes"


def test_a_skipped_system_says_so_and_a_failed_scenario_shows_error(table: Any) -> None:
    r = results(skipped={"zenoh": "eclipse-zenoh not installed"})
    del r["mesh_rtt"]
    r["errors"] = {"mesh_rtt": "TimeoutError"}
    rows = by_figure(table.build_rows(r))
    assert rows["one-way msgs/s (async handler, plain send loop)"][3] == "skipped"
    assert rows["one-way msgs/s (async handler, plain send loop)"][6] == ""  # no ratio to a skipped system
    assert rows["request/reply p50 / p99 us (plain awaited loop)"][1] == "ERROR"
    assert rows["request/reply p50 / p99 us (plain awaited loop)"][-1] == "-"
