"""The side-by-side table of compare.py: meshd | NATS | Zenoh | raw pyzmq, ratios, goals.

Each row is declared once in ROWS as (figure, cell function, goal); a cell function takes the
results and returns the row's cells (meshd, NATS, Zenoh, raw, meshd/NATS, meshd/Zenoh, met). A
figure whose result is missing shows ``ERROR`` (the scenario failed) or ``skipped`` (the system is
not installed). Ratios: throughput meshd/other (higher is better), latency and memory
meshd/other (lower is better).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from table import print_grid

R = dict[str, Any]
Cells = tuple[str, str, str, str, str, str, bool | None]
HEAD = ["figure", "meshd", "NATS", "Zenoh", "raw pyzmq", "meshd/NATS", "meshd/Zenoh", "goal", "met?"]
SYSTEMS = ("mesh", "nats", "zenoh", "raw")


def _get(r: R, key: str) -> Any:
    return r.get(key)


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def _ratio(a: float | None, b: float | None, fmt: str = "{:.2f}x") -> str:
    return fmt.format(a / b) if a is not None and b else ""


def _cell(r: R, system: str, key: str, text: Callable[[Any], str]) -> str:
    if system in r["meta"].get("skipped", {}) and system != "mesh":
        return "skipped"
    res = r.get(key)
    if res is None:
        return "ERROR" if key in r.get("errors", {}) or system == "mesh" else ""
    try:
        return text(res)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return "ERROR"


def throughput(suffix: str, min_vs_nats: float | None = None) -> Callable[[R], Cells]:
    """msgs/s at the (slowest) receiver, for ``{system}_{suffix}``."""
    def f(r: R) -> Cells:
        cells = [_cell(r, s, f"{s}_{suffix}", lambda x: _fmt_rate(x["rate"])) for s in SYSTEMS]
        m, n, z = (r.get(f"{s}_{suffix}") or {} for s in ("mesh", "nats", "zenoh"))
        vn, vz = _ratio(m.get("rate"), n.get("rate")), _ratio(m.get("rate"), z.get("rate"))
        both = min_vs_nats and m.get("rate") and n.get("rate")
        met = (m["rate"] / n["rate"] >= min_vs_nats) if both else None
        return (*cells, vn, vz, met)  # type: ignore[return-value]
    return f


def lost(suffix: str) -> Callable[[R], Cells]:
    """Messages lost over all runs (meshd: with what INBOX_FULL refused and the sender resent)."""
    def text(x: Any) -> str:
        refused = sum((run.get("error_codes") or {}).get("INBOX_FULL", 0) for run in x.get("runs", []))
        n = x.get("lost_all_runs", x.get("lost_total", 0))
        return f"{n} ({refused} resent after INBOX_FULL)" if refused else str(n)

    def f(r: R) -> Cells:
        cells = [_cell(r, s, f"{s}_{suffix}", text) for s in SYSTEMS]
        m = r.get(f"mesh_{suffix}") or {}
        return (*cells, "", "", (m.get("lost_all_runs") == 0) if m else None)  # type: ignore[return-value]
    return f


def latency(r: R) -> Cells:
    cells = [_cell(r, s, f"{s}_rtt", lambda x: f"{x['p50_us']:.0f} / {x['p99_us']:.0f}") for s in SYSTEMS]
    m, n, z = (r.get(f"{s}_rtt") or {} for s in ("mesh", "nats", "zenoh"))
    vn = vz = ""
    met = None
    if m and n:
        vn = f"{m['p50_us'] / n['p50_us']:.1f}x / {m['p99_us'] / n['p99_us']:.1f}x"
        met = m["p50_us"] <= 1.5 * n["p50_us"] and m["p99_us"] <= 2 * n["p99_us"]
    if m and z:
        vz = f"{m['p50_us'] / z['p50_us']:.1f}x / {m['p99_us'] / z['p99_us']:.1f}x"
    return (*cells, vn, vz, met)  # type: ignore[return-value]


def idle_agent(r: R) -> Cells:
    idle = r.get("idle", {})

    def mib(key: str) -> str:
        x = idle.get(key)
        return f"{x['rss_mib']:.0f}" if x else ""

    m = idle.get("meshd_agent")
    n, z = idle.get("nats_client"), idle.get("zenoh_peer")
    return (mib("meshd_agent") or "ERROR", mib("nats_client") or _skip(r, "nats"),
            mib("zenoh_peer") or _skip(r, "zenoh"), mib("raw_pyzmq"),
            _ratio(m and m["rss_mib"], n and n["rss_mib"]), _ratio(m and m["rss_mib"], z and z["rss_mib"]),
            (m["rss_mib"] <= 25) if m else None)


def idle_daemon(r: R) -> Cells:
    idle = r.get("idle", {})
    d = idle.get("meshd_daemon") or {}
    worst = max(d.values()) if d else None
    srv = idle.get("nats_server")
    return (" / ".join(f"{v:.0f}" for v in d.values()) or "ERROR",
            f"{srv:.0f} (server)" if srv else _skip(r, "nats"), "(no daemon)", "(no daemon)",
            _ratio(worst, srv), "", (worst <= 32) if worst else None)


def agent_imports(r: R) -> Cells:
    x = r.get("idle", {}).get("meshd_agent")
    heavy = ", ".join(x["heavy"]) if x and x["heavy"] else ("none" if x else "ERROR")
    return (heavy, "", "", "", "", "", (not x["heavy"]) if x else None)


def cpu(r: R) -> Cells:
    m = (r.get("mesh_oneway") or {}).get("daemon_cpu_us_per_msg") or {}
    n = (r.get("nats_oneway") or {}).get("daemon_cpu_us_per_msg") or {}
    srv = n.get("nats-server")
    worst = max(m.values()) if m else None
    return (" / ".join(f"{v:.1f}" for v in m.values()) or "ERROR",
            f"{srv:.1f} (server)" if srv is not None else _skip(r, "nats"), "(no daemon)", "(no daemon)",
            _ratio(worst, srv), "", None)


def soak(r: R) -> Cells:
    s = r.get("soak")
    if not s or not s.get("rss"):
        return ("ERROR", "", "", "", "", "", None)
    growth = {k: v["growth_after_quarter"] for k, v in s["rss"].items()}
    text = " / ".join(f"{v:+.1f}" for v in growth.values())
    text += f" ({s['achieved']:,.0f} msgs/s for {s['seconds']:g} s)"
    return (text, "", "", "", "", "", max(growth.values()) <= 2.0)


def rss_after_load(r: R) -> Cells:
    after, idle = r.get("rss_after_load") or {}, (r.get("idle") or {}).get("meshd_daemon") or {}
    text = " / ".join(f"{v:.0f}" for v in after.values())
    if idle:
        text += f" (idle: {' / '.join(f'{v:.0f}' for v in idle.values())})"
    return (text or "ERROR", "", "", "", "", "", None)


# Daemon counters of messages dropped (each one a loss the table's 'lost' rows may explain).
DROPS = ("publish_local_dropped", "publish_remote_dropped", "topic_dropped", "malformed")


def daemon_drops(r: R) -> Cells:
    stats = r.get("daemon_stats_after_load") or {}
    if not stats:
        return ("ERROR", "", "", "", "", "", None)
    drops = " / ".join(str(sum(st.get(k, 0) for k in DROPS)) for st in stats.values())
    stale = " / ".join(str(st.get("peer_stale", 0)) for st in stats.values())
    return (f"{drops} (peers flipped stale: {stale})", "", "", "", "", "", None)


def extra_tp(key: str) -> Callable[[R], Cells]:
    def f(r: R) -> Cells:
        x = r.get(key)
        if x is None:
            return ("ERROR" if key in r.get("errors", {}) else "not run", "", "", "", "", "", None)
        lost = f" (lost {x['lost_total']})" if x.get("lost_total") else ""
        return (_fmt_rate(x["rate"]) + lost, "", "", "", "", "", None)
    return f


def typed_tp(r: R) -> Cells:
    """The headline one-way row with a typed handler, and its ratio to the untyped row."""
    t, u = r.get("typed_oneway"), r.get("mesh_oneway")
    if t is None or u is None:
        return ("ERROR" if "typed_oneway" in r.get("errors", {}) else "not run", "", "", "", "", "", None)
    ratio = t["rate"] / u["rate"] if u["rate"] else 0.0
    return (f"{_fmt_rate(t['rate'])} ({ratio:.2f}x untyped)", "", "", "", "", "", ratio >= 0.8)


def rtt_of(key: str) -> Callable[[R], Cells]:
    def f(r: R) -> Cells:
        x = r.get(key)
        if x is None:
            return ("ERROR" if key in r.get("errors", {}) else "not run", "", "", "", "", "", None)
        return (f"{x['p50_us']:.0f} / {x['p99_us']:.0f}", "", "", "", "", "", None)
    return f


def embedded_latency(r: R) -> Cells:
    """Two embedded agents (each process runs its own node, docs/embedded.md) beside Zenoh peer."""
    e, z = r.get("emb_rtt"), r.get("zenoh_rtt")
    cell = _cell(r, "mesh", "emb_rtt", lambda x: f"{x['p50_us']:.0f} / {x['p99_us']:.0f}")
    zcell = _cell(r, "zenoh", "zenoh_rtt", lambda x: f"{x['p50_us']:.0f} / {x['p99_us']:.0f}")
    vz = f"{e['p50_us'] / z['p50_us']:.1f}x / {e['p99_us'] / z['p99_us']:.1f}x" if e and z else ""
    return (cell, "", zcell, "", "", vz, (e["p50_us"] <= z["p50_us"]) if e and z else None)


def embedded_throughput(r: R) -> Cells:
    e, z = r.get("emb_oneway") or {}, r.get("zenoh_oneway") or {}
    cell = _cell(r, "mesh", "emb_oneway", lambda x: _fmt_rate(x["rate"]))
    zcell = _cell(r, "zenoh", "zenoh_oneway", lambda x: _fmt_rate(x["rate"]))
    met = (e["rate"] >= z["rate"]) if e.get("rate") and z.get("rate") else None
    return (cell, "", zcell, "", "", _ratio(e.get("rate"), z.get("rate")), met)


def embedded_lost(r: R) -> Cells:
    e = r.get("emb_oneway")
    text = _cell(r, "mesh", "emb_oneway", lambda x: str(x.get("lost_all_runs", x.get("lost_total", 0))))
    return (text, "", "", "", "", "", (e.get("lost_all_runs") == 0) if e else None)


def _skip(r: R, system: str) -> str:
    return "skipped" if system in r["meta"].get("skipped", {}) else "ERROR"


ROWS: list[tuple[str, Callable[[R], Cells], str]] = [
    ("one-way msgs/s (async handler, plain send loop)", throughput("oneway", 1.0), ">= 1.0x NATS"),
    ("  lost", lost("oneway"), "0"),
    ("one-way msgs/s, typed handler (validated model)", typed_tp, ">= 0.8x untyped"),
    ("request/reply p50 / p99 us (plain awaited loop)", latency, "<= 1.5x / 2x NATS"),
    ("embedded agents: request/reply p50 / p99 us", embedded_latency, "p50 <= Zenoh"),
    ("embedded agents: one-way msgs/s", embedded_throughput, ">= 1.0x Zenoh"),
    ("  lost (embedded)", embedded_lost, "0"),
    ("publish to 4 subs, per-sub msgs/s (plain loop)", throughput("publish", 0.8), ">= 0.8x NATS"),
    ("  lost (all subscribers)", lost("publish"), "0"),
    ("idle RSS MiB: agent / client process", idle_agent, "<= 25"),
    ("idle RSS MiB: daemons A / B | server", idle_daemon, "<= 32"),
    ("  daemon-side modules the agent imports", agent_imports, "none"),
    ("CPU us/msg one-way: daemons A / B | server", cpu, "(info)"),
    ("RSS growth MiB under steady load, A / B", soak, "<= +2"),
    ("daemon RSS MiB after all the runs above, A / B", rss_after_load, "(info)"),
    ("batches dropped in daemons A / B, all runs", daemon_drops, "(info)"),
    ("(extra) one-way, plain def handler", extra_tp("x_sync_oneway"), "(info)"),
    ("(extra) publish, 256 in flight, per sub", extra_tp("x_publish_256"), "(info)"),
    ("(extra) request/reply, plain def handler", rtt_of("x_sync_rtt"), "(info)"),
    ("(extra) one-way, pre-encoded raw-wire sender", extra_tp("x_wire_tp"), "(info)"),
    ("(extra) rtt, raw-wire agents: the daemons' share", rtt_of("wire_rtt"), "(info)"),
    ("(extra) rtt floor: 2 bare pyzmq relays, 6 hops", rtt_of("relay_rtt"), "(info)"),
]


def build_rows(r: R) -> list[list[str]]:
    rows = []
    for figure, cell, goal in ROWS:
        try:
            *cells, met = cell(r)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            cells, met = ["ERROR", "", "", "", "", ""], None
        rows.append([figure, *cells, goal, "-" if met is None else ("yes" if met else "NO")])
    return rows


def print_rows(rows: list[list[str]], r: R) -> None:
    print_grid(HEAD, rows)
    meta = r["meta"]
    print("meshd: agent -> daemon A -> daemon B -> agent (4 processes); NATS: nats-py clients and one "
          "nats-server; Zenoh: peer-to-peer sessions; raw pyzmq: DEALER -> ROUTER, PUB -> SUB. "
          f"Payload {meta['payload_bytes']} bytes, msgpack, fresh per message.")
    print(f"total {r.get('total_s', 0):.0f} s; {meta['date']}; {meta['machine']}; load average "
          f"{meta['loadavg_at_start'][0]:.1f} at start, {meta.get('loadavg_at_end', [float('nan')])[0]:.1f} "
          "at end")
    for system, why in meta.get("skipped", {}).items():
        print(f"skipped {system}: {why}")


EMBEDDED_FIGURES = frozenset(figure for figure, _, _ in ROWS[:6])
"""The rows ``compare.py --embedded`` measures: the daemon path, the embedded one, their losses."""
