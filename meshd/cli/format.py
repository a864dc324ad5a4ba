"""How meshctl prints: JSON lines and aligned tables (no sockets, no daemon).

Owns: the output formats of meshctl (``print_json``, ``table``/``table_lines``,
``task_summary_cell``). Must not touch: what is printed (the commands in meshd/cli.py,
meshd/cli/top.py, meshd/cli/keys.py decide that).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["print_json", "table", "table_lines", "task_summary_cell"]


def print_json(obj: Any) -> None:
    print(json.dumps(obj, default=str, sort_keys=True), flush=True)


def table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    print("\n".join(table_lines(rows, columns)))


def table_lines(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in columns}
    out = ["  ".join(c.upper().ljust(widths[c]) for c in columns)]
    out += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns) for r in rows]
    return out


def task_summary_cell(summary: Any, width: int = 40) -> str:
    """A ``tasks_summary`` (a map of counts, or a coms-net list of {title, status}) on one line."""
    if isinstance(summary, list):
        counts: dict[str, int] = {}
        for item in summary:
            if isinstance(item, dict):
                status = str(item.get("status", "?"))
                counts[status] = counts.get(status, 0) + 1
        summary = counts
    if isinstance(summary, dict):
        text = " ".join(f"{k}={v}" for k, v in summary.items())
    else:
        text = "" if summary is None else str(summary)
    return text[:width]


def plugin_rows(plugins: dict[str, Any]) -> list[dict[str, Any]]:
    """``meshctl plugins``: one row per loaded plugin and hook, with the time spent in it (a
    plugin with no timed call yet gets one row without a hook); the CPU-heaviest first."""
    times = plugins.get("hook_time") or {}
    rows: list[dict[str, Any]] = []
    for name in plugins.get("loaded") or []:
        hooks = times.get(name) or {}
        if not hooks:
            rows.append({"plugin": name, "hook": "", "calls": 0, "total_ms": 0.0, "cpu_ms": 0.0,
                         "mean_ms": 0.0})
        for hook, t in hooks.items():
            calls = int(t.get("calls") or 0)
            total = float(t.get("seconds") or 0.0) * 1000
            rows.append({"plugin": name, "hook": hook, "calls": calls, "total_ms": round(total, 3),
                         "cpu_ms": round(float(t.get("cpu_seconds") or 0.0) * 1000, 3),
                         "mean_ms": round(total / calls, 3) if calls else 0.0})
    return sorted(rows, key=lambda r: (-r["cpu_ms"], r["plugin"], r["hook"]))
