"""Command-line parts for edge fleets: ``meshd doctor``, ``meshd reset-identity``, ``meshctl
doctor`` output and ``meshctl keys trust NAME`` with the key seen in discovery.

Owns: printing a doctor report and its exit code (0 no problem, 1 a problem found), and asking a
running daemon for a discovered node's key. It must not judge problems (meshd/daemon/doctor.py does) or
write keys (meshd/mesh/keys.py does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from meshd.config.settings import find_agent_socket, load_settings
from meshd.errors import ConfigError, MeshError

__all__ = ["discovered_key", "doctor_with_mdns", "meshd_doctor", "meshd_reset_identity", "print_report"]


def print_report(report: dict[str, Any], as_json: bool) -> int:
    """Print a doctor report; 1 when it lists a problem, else 0."""
    problems = report.get("problems") or []
    if as_json:
        print(json.dumps(report, default=str, sort_keys=True))
        return 1 if problems else 0
    facts = report.get("facts") or {}
    print(f"mesh {facts.get('mesh')!r}, protocol {facts.get('protocol')} (accepts "
          f"{facts.get('accepts_protocols')}), discovery {'on' if facts.get('discovery') else 'off'}")
    for f in facts.get("interfaces", []):
        print(f"interface {f.get('interface') or '?'} {f['address']}: "
              f"{'up' if f['up'] else 'DOWN'}, {'multicast' if f['multicast'] else 'NO MULTICAST'}")
    for p in facts.get("peers", []):
        print(f"peer {p['node']} ({p['name']}) {p['state']} at {p['router']}: heard "
              f"{p['heard_ago']} s ago, confirmed hearing us {p['confirmed_ago']} s ago")
    mdns = facts.get("mdns") or {}
    for t in mdns.get("interfaces", []):
        sources = ", ".join(t["meshd_answer_sources"]) or "none"
        print(f"mdns on {t['interface']} {t['address']} over {mdns['listened_s']:g} s: {t['queries']} "
              f"queries ({t['meshd_queries']} for meshd), {t['answers']} answers ({t['meshd_answers']} "
              f"meshd, from {sources})" + (f"; {t['error']}" if t["error"] else ""))
    if mdns.get("error"):
        print(f"mdns: {mdns['error']}")
    if facts.get("firewall"):
        print(f"firewall: {facts['firewall']}")
    for p in problems:
        print(f"PROBLEM {p['code']}: {p['message']}\n  fix: {p['hint']}")
    print(f"{len(problems)} problem(s) found" if problems else "no problem found")
    return 1 if problems else 0


async def _ask(socket: Path | None, op: str, listen: float = 0.0) -> Any:
    from meshd.client import Agent

    async with Agent(f"meshctl-{os.getpid()}", socket=socket or find_agent_socket()) as me:
        return await doctor_with_mdns(me, listen) if op == "doctor" else await me.admin(op)


def _chosen(report: dict[str, Any]) -> tuple[list[tuple[str, str]], list[str]]:
    """The report's interfaces that are on this host too (the daemon may run in another network
    namespace), and the addresses that are not: only the former are joined."""
    from meshd.daemon.doctor import interface_facts

    addresses = [f["address"] for f in report["facts"].get("interfaces", []) if f["present"]]
    here = [(f["interface"], f["address"]) for f in interface_facts(addresses) if f["present"]]
    return here, [a for a in addresses if a not in {addr for _, addr in here}]


def _listen(report: dict[str, Any], listen: float, ask: Any = None) -> Any:
    """Count mDNS on the report's interfaces for ``listen`` seconds; ``ask`` (a coroutine
    function) is awaited once the socket listens: the daemon's doctor op with an mDNS query."""
    from meshd.daemon.doctor import mdns_findings
    from meshd.discovery.mdns_watch import MdnsListener

    async def run() -> dict[str, Any]:
        here, elsewhere = _chosen(report)
        if elsewhere or not here:
            report["facts"]["mdns"] = {"error": f"the daemon's addresses {', '.join(elsewhere) or '(none)'} "
                                       "are not on this host's interfaces: run the doctor on its host"}
            return report
        try:
            listener = MdnsListener(here)
        except OSError as exc:
            report["facts"]["mdns"] = {"error": f"cannot listen on UDP 5353: {exc}"}
            return report
        with listener:
            fresh = await ask() if ask is not None else report
            traffic = await asyncio.to_thread(listener.run, listen)
        mdns_findings(fresh, [t.as_dict() for t in traffic], listen)
        return fresh
    return run()


async def doctor_with_mdns(me: Any, listen: float) -> dict[str, Any]:
    """The daemon's doctor report; with ``listen`` > 0, plus the mDNS seen on each of its
    interfaces while it sends one query (this process only listens)."""
    report: dict[str, Any] = await me.admin("doctor")
    if listen <= 0:
        return report
    result: dict[str, Any] = await _listen(report, listen, lambda: me.admin("doctor", mdns_query=True))
    return result


def discovered_key(socket: Path | None, name: str) -> str | None:
    """The key of the untrusted node ``name`` (name, node id or trust name) the daemon discovered."""
    try:
        rows = asyncio.run(_ask(socket, "peers.discovered"))
    except (MeshError, OSError) as exc:
        print(f"meshctl: cannot ask the running daemon for the key of {name!r}: {exc} (give the key: "
              "meshctl keys trust NAME KEY)", file=sys.stderr)
        return None
    found = [r for r in rows if r.get("state") == "untrusted" and r.get("key")
             and name in (r.get("node"), r.get("name"), r.get("trust_name"))]
    if not found:
        print(f"meshctl: no untrusted node {name!r} discovered (`meshctl peers --all` lists them)",
              file=sys.stderr)
        return None
    if len({r["key"] for r in found}) > 1:
        print(f"meshctl: several nodes named {name!r} with different keys; use the node id", file=sys.stderr)
        return None
    row = found[0]
    print(f"{name}: node {row['node']} at {', '.join(row['addresses'])}, key fingerprint "
          f"{row['fingerprint']} (as discovered; it matches `meshctl keys show` on that host?)")
    return str(row["key"])


def _settings(args: argparse.Namespace) -> Any:
    overrides: dict[str, Any] = {}
    if args.state_dir:
        overrides["state_dir"] = args.state_dir
    if args.interfaces:
        overrides["interfaces"] = args.interfaces
    env = dict(os.environ)
    config = args.config or (Path(env["MESHD_CONFIG"]) if env.get("MESHD_CONFIG") else None)
    return load_settings(config, overrides=overrides, environ=env)


def meshd_doctor(args: argparse.Namespace) -> int:
    """The running daemon's report if one answers on the socket, else what can be checked here."""
    from meshd.daemon.doctor import local_report
    from meshd.discovery.mdns import default_interfaces

    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"meshd: config error: {exc}", file=sys.stderr)
        return 2
    socket = args.socket or find_agent_socket()
    if socket.exists():
        try:
            return print_report(asyncio.run(_ask(socket, "doctor", args.listen)), args.json)
        except (MeshError, OSError) as exc:
            print(f"meshd doctor: the daemon at {socket} does not answer ({exc}); local checks only",
                  file=sys.stderr)
    report = local_report(settings, list(settings.interfaces) or default_interfaces())
    if args.listen > 0:
        report = asyncio.run(_listen(report, args.listen))
    report["problems"].insert(0, {"code": "not_running", "message": f"no daemon answers on {socket}",
                                  "hint": "start meshd (systemctl start meshd), or pass --socket"})
    return print_report(report, args.json)


def meshd_reset_identity(args: argparse.Namespace) -> int:
    from meshd.mesh.keys import reset_identity

    try:
        settings = _settings(args)
    except ConfigError as exc:
        print(f"meshd: config error: {exc}", file=sys.stderr)
        return 2
    removed = reset_identity(settings.state_dir)
    if not removed:
        print(f"no identity in {settings.state_dir}: a new one is made at the first start")
        return 0
    for path in removed:
        print(f"removed {path}")
    print("restart meshd: it makes a new node id and keypair (in trust_mode keys, the other nodes must "
          "trust the new key: meshctl keys trust NAME on each)")
    return 0
