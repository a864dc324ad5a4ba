"""``meshctl a2a list|trust NAME|stats``: an operator's side of ``meshd a2a`` (the A2A agents
found on the LAN, and its counters).

Owns the parsers and what they print. It asks the ``meshd a2a`` binding attached to this node
(found in the directory by its registration metadata, or named with ``--binding``) over the mesh,
topic :data:`TOPIC_LAN`; the binding answers only agents of its own node. Never imports the SDK.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Final

__all__ = ["BINDING_META", "TOPIC_LAN", "add_parsers", "run"]

TOPIC_LAN: Final = "meshd.a2a.lan"
BINDING_META: Final = "meshd_a2a"  # registration metadata key of the binding's own agent


def add_parsers(sub: Any) -> None:
    a = sub.add_parser("a2a", help="A2A agents found on the LAN by meshd a2a (docs/a2a.md)")
    asub = a.add_subparsers(dest="a2a_cmd", required=True)
    p = asub.add_parser("list", help="discovered A2A agents, admitted or not")
    p.add_argument("--json", action="store_true")
    p.add_argument("--binding", default=None, help="the meshd a2a agent (default: the one on this node)")
    p = asub.add_parser("stats", help="meshd a2a's bounds and counters: tasks, refusals, drops (JSON)")
    p.add_argument("--binding", default=None, help="the meshd a2a agent (default: the one on this node)")
    p = asub.add_parser("trust", help="admit a discovered A2A agent: it joins the mesh")
    p.add_argument("name", help="its name as `meshctl a2a list` shows it")
    p.add_argument("--binding", default=None, help="the meshd a2a agent (default: the one on this node)")


async def _binding(me: Any, wanted: str | None) -> str | None:
    if wanted:
        return wanted
    info = await me.node_info()
    ours = [str(r["name"]) for r in await me.agents()
            if r.get("node") == info.get("node") and (r.get("metadata") or {}).get(BINDING_META)]
    return ours[0] if len(ours) == 1 else None


async def run(me: Any, args: argparse.Namespace) -> int:
    binding = await _binding(me, args.binding)
    if binding is None:
        print("meshctl a2a: no single meshd a2a on this node (start one, or name it with --binding)")
        return 1
    body: dict[str, Any] = {"op": args.a2a_cmd}
    if args.a2a_cmd == "trust":
        body["name"] = args.name
    result = await me.request(binding, TOPIC_LAN, body, timeout=30)
    if args.a2a_cmd == "list" and not args.json:
        for item in result:
            state = f"admitted as {item['mesh_name']}" if item["admitted"] else "discovered, not admitted"
            print(f"{item['name']:<40} {state:<32} {item['url']}")
        return 0
    print(json.dumps(result, default=str, sort_keys=True))
    return 0
