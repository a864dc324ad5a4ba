"""The summary table: scenario | metric | meshd | raw pyzmq | ratio | goal | met?

Every row is declared once in ROWS with a cell function of the results that returns
(meshd, raw pyzmq, ratio, met); the builders below make those functions. A row whose results are
missing (the scenario failed) is shown as ERROR instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

R = dict[str, Any]
Cells = tuple[str, str, str, bool | None]
Cell = Callable[[R], Cells]
HEAD = ["scenario", "metric", "meshd", "raw pyzmq", "ratio", "goal", "met?"]


def rate(x: float) -> str:
    return f"{x:,.0f}"


def p50_p99(res: R) -> str:
    return f"{res['p50_us']:.0f} / {res['p99_us']:.0f}"


def meshd(value: Callable[[R], str], met: Callable[[R], bool] | None = None) -> Cell:
    """A value in the meshd column only, checked against the goal by ``met`` (None: info)."""
    return lambda r: (value(r), "", "", met(r) if met else None)


def raw(value: Callable[[R], str]) -> Cell:
    """A value in the raw pyzmq column only: the baseline."""
    return lambda r: ("", value(r), "", None)


def tp(key: str, goal_rate: float | None = None, goal_ratio: float | None = None) -> Cell:
    """Throughput against raw (a); the goal is a rate or a fraction of raw."""
    def f(r: R) -> Cells:
        m, base = r[key]["rate"], r["raw_tp"]["rate"]
        met = (m >= goal_rate) if goal_rate else (m / base >= goal_ratio) if goal_ratio else None
        return rate(m), rate(base), f"{m / base:.2f}", met
    return f


def lost(key: str) -> Cell:
    """Messages lost over all runs, with the error codes the sender was told (goal 0)."""
    def text(r: R) -> str:
        codes: dict[str, int] = {}
        for run in r[key].get("runs", []):
            for code, k in (run.get("error_codes") or {}).items():
                codes[code] = codes.get(code, 0) + k
        told = ", ".join(f"{k} {c}" for c, k in codes.items())
        n = r[key]["lost_all_runs"]
        return f"{n} ({told} reported)" if told else str(n)
    return meshd(text, lambda r: r[key]["lost_all_runs"] == 0)


def lat(key: str, base: str, goal_p50: float | None = None) -> Cell:
    """p50 / p99 latency against a baseline, as 'times slower'."""
    def f(r: R) -> Cells:
        m, b = r[key], r[base]
        ratio = f"{m['p50_us'] / b['p50_us']:.1f}x / {m['p99_us'] / b['p99_us']:.1f}x"
        return p50_p99(m), p50_p99(b), ratio, (m["p50_us"] < goal_p50) if goal_p50 else None
    return f


def vs_plain(key: str, pair: str, minimum: float) -> Cell:
    """Throughput of ``key`` over plaintext qos 0 (b), best/best, then each back-to-back pair."""
    def ratio(r: R) -> float:
        return float(r[key]["rate"] / r["mesh_tp"]["rate"])

    def text(r: R) -> str:
        each = r.get("pair_ratios", {}).get(pair, [])
        per = f" (per rep {', '.join(f'{x:.2f}' for x in each)})" if len(each) > 1 else ""
        return f"{ratio(r):.2f}{per}"
    return meshd(text, lambda r: ratio(r) >= minimum)


def worst(key: str, field: str, limit: float | None = None) -> Cell:
    """The largest ``field`` over the runs listed under ``key`` (ms), against ``limit``."""
    def value(r: R) -> float:
        return float(max(x[field] for x in r[key]))
    return meshd(lambda r: f"{value(r):.0f}", (lambda r: value(r) <= limit) if limit else None)


def per_daemon(count: Callable[[R], int]) -> Cell:
    """A counter of daemons A / B after the load runs."""
    return meshd(lambda r: " / ".join(str(count(r["daemon_stats_after_load"][n])) for n in ("A", "B")))


def _curve_lat_ratio(r: R) -> str:
    c, z = r["curve_rtt"], r["mesh_rtt"]
    return f"{c['p50_us'] / z['p50_us']:.2f}x / {c['p99_us'] / z['p99_us']:.2f}x"


def _q1_dups(r: R) -> str:
    runs = r["qos1_tp"]["runs"]
    return f"{sum(x['dups_total'] for x in runs)} / {sum(x['send_failed'] for x in runs)}"


def _q1_commits(r: R) -> str:
    q = r["qos1_tp"]
    return f"{q['msgs_per_a_commit']:.0f} ({q['a_commits']:,} for {q['sent']:,})"


DROPS = ("publish_local_dropped", "publish_remote_dropped", "topic_dropped", "malformed")

# (scenario, metric, cell, goal), in the order printed.
ROWS: list[tuple[str, str, Cell, str]] = [
    ("(a) raw pyzmq", "one-way msgs/s", raw(lambda r: rate(r["raw_tp"]["rate"])), ""),
    ("(a) raw pyzmq", "lost", raw(lambda r: str(r["raw_tp"]["lost_all_runs"])), ""),
    ("(a) raw pyzmq", "rtt p50 / p99 us", raw(lambda r: p50_p99(r["raw_rtt"])), ""),
    ("(b) one-way A->B", "msgs/s at receiver", tp("mesh_tp", goal_rate=60_000), ">= 60,000"),
    ("(b) one-way A->B", "lost (all runs)", lost("mesh_tp"), "0"),
    ("(g) qos 1 one-way A->B", "msgs/s at receiver", tp("qos1_tp"), "(info)"),
    ("(g) qos 1 one-way A->B", "qos 1 / qos 0 (b) msgs/s", vs_plain("qos1_tp", "qos1/qos0", 1 / 3),
     ">= 0.33"),
    ("(g) qos 1 one-way A->B", "lost (all runs)", lost("qos1_tp"), "0"),
    ("(g) qos 1 one-way A->B", "duplicates / failed sends", meshd(_q1_dups), "(info)"),
    ("(g) qos 1 one-way A->B", "msgs per commit, daemon A", meshd(_q1_commits), "(info)"),
    ("(h) CURVE one-way", "msgs/s at receiver", tp("curve_tp"), "(info)"),
    ("(h) CURVE one-way", "CURVE / plaintext (b) msgs/s", vs_plain("curve_tp", "curve/plain", 0.7),
     ">= 0.70"),
    ("(h) CURVE one-way", "lost (all runs)", lost("curve_tp"), "0"),
    ("(h) CURVE request/reply", "rtt p50 / p99 us", lat("curve_rtt", "raw_rtt"), "(info)"),
    ("(h) CURVE request/reply", "CURVE / plaintext (c) p50 / p99", meshd(_curve_lat_ratio), "(info)"),
    ("(c) request/reply", "rtt p50 / p99 us", lat("mesh_rtt", "raw_rtt", 450), "p50 < 450"),
    ("(c') raw-wire req/rep", "rtt p50 / p99 us", lat("wire_rtt", "raw_rtt"), "(info)"),
    ("(c'') (c) vs 2 relays", "rtt p50 / p99 us", lat("mesh_rtt", "relay_rtt"), "(info)"),
    ("(d) publish, 4 subs", "msgs/s per sub (min)", tp("publish", goal_rate=25_000), ">= 25,000"),
    ("(d) publish, 4 subs", "lost (all runs, subs)", lost("publish"), "0"),
    ("(d') raw-wire publisher", "msgs/s per sub (min)", tp("wire_publish"), "(info)"),
    ("(d') raw-wire publisher", "lost (all runs, subs)", lost("wire_publish"), "0"),
    ("(e) raw-wire sender", "msgs/s at receiver", tp("wire_tp", goal_ratio=0.4), ">= 0.40 of (a)"),
    ("(e) raw-wire sender", "lost (all runs)", lost("wire_tp"), "0"),
    ("(f) raw wire both ends", "msgs/s at receiver", tp("wire_raw_tp"), "(info)"),
    ("(f) raw wire both ends", "lost (all runs)", lost("wire_raw_tp"), "0"),
    ("under load", "peers flipped stale, A / B", per_daemon(lambda st: st.get("peer_stale", 0)), "(info)"),
    ("under load", "batches dropped in daemons, A / B",
     per_daemon(lambda st: sum(st.get(k, 0) for k in DROPS)), "(info)"),
    ("discovery", "both ways, ms from spawn (worst)", worst("discovery", "both_ways_ms", 500), "<= 500"),
    ("discovery", "  spawn -> socket bound", worst("discovery", "new_ready_ms"), ""),
    ("discovery", "  socket bound -> both online", worst("discovery", "after_ready_ms"), ""),
    ("SIGKILL", "seen stale by peer, ms (worst)", worst("stale", "stale_ms", 1000), "<= 1000"),
]


def build_table(r: R) -> list[list[str]]:
    """The rows, as lists of strings (also stored in the JSON under "table")."""
    rows: list[list[str]] = []
    for scn, metric, cell, goal in ROWS:
        try:
            mesh, base, ratio, met = cell(r)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            rows.append([scn, metric, "ERROR", "", "", goal, "NO" if goal else "-"])
            continue
        rows.append([scn, metric, mesh, base, ratio, goal, "-" if met is None else ("yes" if met else "NO")])
    return rows


def print_grid(head: list[str], rows: list[list[str]]) -> None:
    """A blank line, then ``head`` and ``rows`` as a plain-text table, each column as wide as its
    widest cell (bench.py's and compare.py's tables)."""
    widths = [max(len(head[i]), *(len(row[i]) for row in rows)) for i in range(len(head))]
    print()
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for row in rows:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


def print_table(rows: list[list[str]]) -> None:
    print_grid(HEAD, rows)
    print("ratio = meshd / raw pyzmq (throughput: fraction of raw; latency: times slower); "
          "'X / Y' rows hold that ratio in the meshd column")
