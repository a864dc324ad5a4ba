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
