"""``meshctl tools ...`` and ``meshctl approvals ...``: people's side of the syscall tools.

Owns the argument parsers of those two subcommands and what they print. Works only through the
public client API (``Agent.tools``, ``Agent.call_tool`` and requests to the system agent); must not
import the node or the tool machinery.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from meshd.tools.skills import build_skills, skill_schema
from meshd.wire.system_names import TOPIC_APPROVALS, system_agent_name

__all__ = ["add_parsers", "run"]

FORMATS = ("openai", "anthropic", "mcp")


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def add_parsers(sub: Any) -> None:
    """Add ``tools`` and ``approvals`` to meshctl's subparsers."""
    t = sub.add_parser("tools", help="syscall tools: list, schemas for LLM APIs, call")
    tsub = t.add_subparsers(dest="tools_cmd", required=True)
    p = tsub.add_parser("list", help="the tools this daemon serves")
    p.add_argument("--json", action="store_true")
    p = tsub.add_parser("schema", help="print the tool schemas as an LLM API takes them (JSON)")
    p.add_argument("--format", choices=FORMATS, default="openai")
    p.add_argument("--skills", action="store_true",
                   help="with the typed skills of the mesh as tools of their own (agent__topic)")
    p = tsub.add_parser("call", help="call a tool and print its result (JSON)")
    p.add_argument("name")
    p.add_argument("args", type=_json_arg, nargs="?", default={}, help="JSON object of arguments")
    p.add_argument("--timeout", type=float, default=30.0)
    a = sub.add_parser("approvals", help="tool calls held for a person's decision")
    asub = a.add_subparsers(dest="approvals_cmd", required=True)
    p = asub.add_parser("list", help="held calls")
    p.add_argument("--json", action="store_true")
    for op in ("allow", "deny"):
        p = asub.add_parser(op, help=f"{op} a held call")
        p.add_argument("id")
        p.add_argument("--reason", default="", help="told to the caller")


def _print(obj: Any) -> None:
    print(json.dumps(obj, default=str, sort_keys=True), flush=True)


async def run(me: Any, args: argparse.Namespace) -> int:
    """Run ``meshctl tools|approvals ...`` with the attached agent ``me``; returns the exit code."""
    if args.cmd == "tools":
        if args.tools_cmd == "list":
            tools = await me.tools()
            if args.json:
                _print(tools)
            else:
                width = max((len(t["name"]) for t in tools), default=4)
                for t in tools:
                    mark = "!" if t["side_effects"] else " "
                    print(f"{t['name']:<{width}} {mark} {t['description']}")
                print("(! = side effects: passes through approval)", file=sys.stderr)
        elif args.tools_cmd == "schema":
            schemas = await me.tools(format=args.format)
            if args.skills:
                skills, _ = build_skills(await me.agents(), exclude=me.name)
                schemas += [skill_schema(s, args.format) for s in skills.values()]
            _print(schemas)
        else:
            _print(await me.call_tool(args.name, args.args, timeout=args.timeout))
        return 0
    sys_agent = system_agent_name(str(me.node))
    if args.approvals_cmd == "list":
        held = await me.request(sys_agent, TOPIC_APPROVALS, {"op": "list"}, timeout=10)
        if args.json:
            _print(held)
        else:
            for h in held:
                when = time.strftime("%H:%M:%S", time.localtime(h["at"]))
                print(f"{h['id']}  {when}  {h['caller']} -> {h['tool']} {json.dumps(h['args'])}")
        return 0
    result = await me.request(sys_agent, TOPIC_APPROVALS,
                              {"op": args.approvals_cmd, "id": args.id, "reason": args.reason}, timeout=10)
    print(f"{result['id']}: {result['decision']} ({result['caller']} -> {result['tool']})")
    return 0
