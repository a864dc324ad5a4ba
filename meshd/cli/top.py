"""``meshctl top``: a live screen of nodes and agents (state, context %, queue depth, tasks).

Owns: building one screen from the daemon's answers and repeating it. Must not touch: how the
daemon is asked (the ``Agent`` it is given) or the table format (meshd/cli/format.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from meshd.cli.format import table_lines, task_summary_cell

__all__ = ["run_top", "top_frame"]


def top_frame(node: dict[str, Any], peers: list[dict[str, Any]], agents: list[dict[str, Any]]) -> str:
    """One screen of ``meshctl top``: nodes, then agents with their state and load."""
    online = sum(1 for p in peers if p.get("state") == "online")
    lines = [f"meshd top  node {node.get('name')} ({node.get('node')})  mesh {node.get('mesh')!r}  "
             f"{online}/{len(peers)} peers online  {time.strftime('%H:%M:%S')}", ""]
    own = sum(1 for a in agents if a.get("node") == node.get("node"))  # without meshctl itself
    rows = [{"node": node.get("node"), "name": node.get("name"), "state": "self",
             "agents": own, "last_seen_ago": 0}]
    rows += [{k: p.get(k) for k in ("node", "name", "state", "agents", "last_seen_ago")} for p in peers]
    lines += table_lines(rows, ["name", "node", "state", "agents", "last_seen_ago"])
    lines.append("")
    agent_rows = []
    for a in agents:
        tele = a.get("telemetry") or {}
        pct = tele.get("context_used_pct")
        agent_rows.append({
            "agent": a.get("name"), "node": a.get("node_name"), "state": a.get("state"),
            "ctx%": f"{pct:.0f}" if isinstance(pct, (int, float)) else "-",
            "queue": tele.get("queue_depth", "-"),
            "tasks": task_summary_cell(tele.get("tasks_summary")),
            "caps": ",".join(a.get("capabilities") or []),
        })
    lines += table_lines(agent_rows, ["agent", "node", "state", "ctx%", "queue", "tasks", "caps"])
    return "\n".join(lines)


async def run_top(me: Any, args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty() and not args.once
    frames = 1 if args.once else args.count
    shown = 0
    while frames is None or shown < frames:
        agents = [a for a in await me.agents() if not str(a.get("name", "")).startswith("meshctl-")]
        screen = top_frame(await me.node_info(), await me.peers(), agents)
        print(("\033[H\033[2J" if tty else "") + screen, flush=True)
        shown += 1
        if frames is not None and shown >= frames:
            break
        await asyncio.sleep(args.interval)
    return 0
