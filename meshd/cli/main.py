"""Command lines: ``meshd`` (run the daemon, demo) and ``meshctl`` (talk to a running daemon).

Exit codes: 0 ok; 1 the operation failed (error printed on one line); 2 bad usage or config.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshd import __version__
from meshd.cli.contracts_view import describe_lines, skills_cell
from meshd.cli.format import plugin_rows, print_json, table
from meshd.cli.top import run_top
from meshd.daemon.run import run_daemon, setup_logging  # noqa: F401  (setup_logging: kept importable here)
from meshd.errors import ConfigError, MeshError
from meshd.mesh.keys import KeyFileError
from meshd.util.paths import find_agent_socket

if TYPE_CHECKING:  # meshd.config imports pydantic: the daemon's own image must not (meshd/daemon/reexec.py)
    from meshd.config.settings import Settings

log = logging.getLogger("meshd")


# --------------------------------------------------------------------------------- meshd

def _run_parser(sub: Any) -> None:
    run = sub.add_parser("run", help="run the daemon in the foreground")
    run.add_argument("--config", type=Path, help="TOML config file (default: $MESHD_CONFIG)")
    run.add_argument("--name", help="this node's human name (default: host name)")
    run.add_argument("--mesh", help="mesh name; daemons of other meshes are ignored")
    run.add_argument("--interface", dest="interfaces", action="append", metavar="IP",
                     help="IPv4 address for mDNS and the mesh (repeatable; default: all suitable)")
    run.add_argument("--port", type=int, help="mesh ROUTER port (0 = any free port)")
    run.add_argument("--pub-port", type=int, help="topic XPUB port (0 = any free port)")
    run.add_argument("--peer", dest="peers", action="append", metavar="tcp://HOST:PORT",
                     help="static peer (repeatable), for networks without multicast")
    run.add_argument("--no-discovery", dest="discovery", action="store_const", const=False,
                     help="turn mDNS off (static peers only)")
    run.add_argument("--state-dir", type=Path, help="where the node id and keys live")
    run.add_argument("--socket", type=Path, help="local agent socket path")
    run.add_argument("--insecure", action="store_const", const=True,
                     help="plaintext mesh, no CurveZMQ (development; loopback only unless "
                          "--allow-insecure-lan)")
    run.add_argument("--allow-insecure-lan", action="store_const", const=True,
                     help="permit --insecure on non-loopback interfaces")
    run.add_argument("--trust-mode", choices=["keys", "secret"])
    run.add_argument("--authorized-keys-dir", type=Path)
    run.add_argument("--mesh-secret-file", type=Path)
    run.add_argument("--heartbeat-interval", type=float)
    run.add_argument("--stale-after", type=float)
    run.add_argument("--offline-after", type=float)
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    run.add_argument("--log-format", choices=["text", "json"])
    run.add_argument("--otlp", dest="otlp_endpoint", metavar="URL",
                     help="export the daemon's own spans over OTLP/HTTP (needs the otel-export extra)")
    run.add_argument("--no-http", dest="http", action="store_const", const=False,
                     help="do not serve the HTTP/SSE gateway and dashboard (docs/http.md)")
    run.add_argument("--http-port", type=int, help="HTTP gateway port (0 = any free port)")
    run.add_argument("--regenerate-id", action="store_true",
                     help="make a new node id and keypair before starting (the fix for a cloned "
                          "state dir; in trust_mode keys, peers must trust the new key)")
    run.add_argument("--settings-fd", type=int, help=argparse.SUPPRESS)  # meshd/daemon/reexec.py


def settings_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    from meshd.config.settings import load_settings

    env = dict(os.environ if environ is None else environ)
    config = args.config or (Path(env["MESHD_CONFIG"]) if env.get("MESHD_CONFIG") else None)
    if config is None and env.get("CONFIGURATION_DIRECTORY"):
        candidate = Path(env["CONFIGURATION_DIRECTORY"].split(":")[0]) / "meshd.toml"
        config = candidate if candidate.exists() else None  # systemd's ConfigurationDirectory=
    keys = ("name", "mesh", "interfaces", "port", "pub_port", "peers", "discovery", "state_dir",
            "socket", "insecure", "heartbeat_interval", "stale_after", "offline_after",
            "log_level", "log_format", "allow_insecure_lan", "trust_mode", "authorized_keys_dir",
            "mesh_secret_file", "http", "http_port", "otlp_endpoint")
    overrides = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    return load_settings(config, overrides=overrides, environ=env)


def meshd_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshd", description="peer-mesh daemon for agents")
    parser.add_argument("--version", action="version", version=f"meshd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    demo = sub.add_parser("demo", help="start a 3-node mesh on 127.0.0.1 and run a collaboration")
    demo.add_argument("--keep-logs", action="store_true", help="print the daemons' logs afterwards")
    demo.add_argument("--plan", action="store_true",
                      help="the plan scenario instead: tasks picked by capability and load (docs/tasks.md)")
    mcp = sub.add_parser("mcp", help="MCP server (stdio, or Streamable HTTP with --http) attached to "
                         "the local daemon as an agent (needs the 'mcp' extra)")  # meshd/bindings/mcp.py
    mcp.add_argument("--socket", type=Path, default=None, help="the daemon's agent socket")
    mcp.add_argument("--name", default=None, help="agent name (default: mcp-<pid>)")
    mcp.add_argument("--capability", action="append", default=[], help="capability to register (repeatable)")
    mcp.add_argument("--inbox", type=int, default=100, help="unread messages kept for wait_message")
    mcp.add_argument("--progress-every", type=float, default=5.0, metavar="SECONDS",
                     help="keep-alive progress notification interval of a running tool call (default 5)")
    mcp.add_argument("--push", action="store_true",
                     help="also push each arriving message as notifications/claude/channel")
    mcp.add_argument("--http", nargs="?", const="127.0.0.1:8767", default=None, metavar="HOST:PORT",
                     help="serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio "
                          "(default 127.0.0.1:8767; port 0: any free port, see mcp-NAME.json)")
    mcp.add_argument("--token-file", type=Path, default=None,
                     help="bearer token file (0600; made if missing; default: mcp-NAME.token "
                          "beside the socket)")
    mcp.add_argument("--tls-cert", type=Path, default=None, help="TLS certificate (PEM) for --http")
    mcp.add_argument("--tls-key", type=Path, default=None, help="TLS private key (PEM) for --http")
    mcp.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                     help="a browser Origin allowed besides the listen address's own (repeatable)")
    mcp.add_argument("--skills-max", type=int, default=64, metavar="N",
                     help="typed topics of the mesh shown as tools of their own (agent__topic; 0: none)")
    mcp.add_argument("--skill", dest="skills_allow", action="append", default=[], metavar="PATTERN",
                     help="only skills whose tool name or agent matches this shell pattern (repeatable)")
    a2a = sub.add_parser("a2a", help="A2A 1.0 server attached to the local daemon: mesh agents as A2A "
                         "agents, external A2A agents as mesh agents (needs the 'a2a' extra)")
    a2a.add_argument("--config", type=Path, default=None,
                     help="the daemon's TOML config; its [a2a] section (default: $MESHD_CONFIG)")
    a2a.add_argument("--socket", type=Path, default=None, help="the daemon's agent socket")
    a2a.add_argument("--name", default=None, help="agent name (default: a2a-<pid>)")
    a2a.add_argument("--listen", default=None, metavar="HOST:PORT",
                     help="listen address (default: a2a.listen, 127.0.0.1:8768; port 0: any free port, "
                          "see a2a-NAME.json)")
    a2a.add_argument("--token-file", type=Path, default=None,
                     help="bearer token file (0600; made if missing; default: a2a-NAME.token beside "
                          "the socket)")
    a2a.add_argument("--tls-cert", type=Path, default=None, help="TLS certificate (PEM)")
    a2a.add_argument("--tls-key", type=Path, default=None, help="TLS private key (PEM)")
    a2a.add_argument("--tls-client-ca", type=Path, default=None,
                     help="require TLS client certificates signed by this CA (the cards say so)")
    from meshd.bindings.nats import cli as bridge_cli  # meshd bridge (docs/sites.md)

    bridge_cli.add_parser(sub)
    for cmd, text in (("doctor", "check interfaces, multicast, peers and discovery; exit 1 on a problem"),
                      ("reset-identity", "delete this node's id and keypair (a cloned state dir); a "
                                         "new one is made at the next start")):
        extra = sub.add_parser(cmd, help=text)
        extra.add_argument("--config", type=Path, help="TOML config file (default: $MESHD_CONFIG)")
        extra.add_argument("--state-dir", type=Path)
        extra.add_argument("--interface", dest="interfaces", action="append", metavar="IP")
        extra.add_argument("--socket", type=Path, help="a running daemon's agent socket")
        extra.add_argument("--json", action="store_true")
        if cmd == "doctor":
            extra.add_argument("--listen", type=_listen_seconds, default=2.0, metavar="SECONDS",
                               help="count mDNS on each interface this long (0: off; default 2)")
    args = parser.parse_args(argv)
    if args.command in ("doctor", "reset-identity"):
        from meshd.cli.field import meshd_doctor, meshd_reset_identity

        return meshd_doctor(args) if args.command == "doctor" else meshd_reset_identity(args)
    if args.command == "mcp":
        from meshd.bindings.mcp import McpOptions, run_mcp_server

        return run_mcp_server(McpOptions(
            socket=args.socket, name=args.name, capabilities=tuple(args.capability),
            inbox_cap=max(1, args.inbox), progress_every=args.progress_every, push=args.push,
            http=args.http, token_file=args.token_file, tls_cert=args.tls_cert, tls_key=args.tls_key,
            allowed_origins=tuple(args.allow_origin), skills_max=max(0, args.skills_max),
            skills_allow=tuple(args.skills_allow)))
    if args.command == "a2a":
        return _meshd_a2a(args)
    if args.command == "bridge":
        return bridge_cli.run_from_args(args)
    if args.command == "demo":
        if args.plan:  # the tasks scenario (meshd/cli/demo_plan.py)
            from meshd.cli.demo_plan import run_plan_demo

            return int(run_plan_demo(keep_logs=args.keep_logs))
        from meshd.cli.demo import run_demo

        return int(run_demo(keep_logs=args.keep_logs))
    from meshd.daemon.reexec import settings_for_run

    try:  # validated here, then (real command line) re-exec'd without pydantic: meshd/daemon/reexec.py
        settings: Any = settings_for_run(args.settings_fd, argv, lambda: settings_from_args(args),
                                         {"regenerate_id": args.regenerate_id})
    except ConfigError as exc:
        print(f"meshd: config error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # an unreadable --settings-fd
        print(f"meshd: {exc}", file=sys.stderr)
        return 2
    return run_daemon(settings, regenerate_id=args.regenerate_id)


def _meshd_a2a(args: argparse.Namespace) -> int:
    """``meshd a2a``: the [a2a] section of the config (pydantic here: this is not the daemon's image)."""
    from meshd.bindings.a2a.run import A2aOptions, run_a2a
    from meshd.config.sections import A2aSettings

    try:
        settings = settings_from_args(argparse.Namespace(config=args.config))
    except ConfigError as exc:
        print(f"meshd a2a: config error: {exc}", file=sys.stderr)
        return 2
    assert isinstance(settings.a2a, A2aSettings)
    return run_a2a(A2aOptions(settings=settings.a2a, socket=args.socket, name=args.name, listen=args.listen,
                              token_file=args.token_file, tls_cert=args.tls_cert, tls_key=args.tls_key,
                              tls_client_ca=args.tls_client_ca, state_dir=settings.state_dir))


# --------------------------------------------------------------------------------- meshctl

def _listen_seconds(text: str) -> float:
    from meshd.discovery.mdns_watch import MAX_LISTEN_SECONDS

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value <= MAX_LISTEN_SECONDS:
        raise argparse.ArgumentTypeError(f"--listen must be 0..{MAX_LISTEN_SECONDS:g} s, not {text}")
    return value


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None


def _http(args: argparse.Namespace) -> int:
    """meshctl http ...: find the gateway through http.json / http.token; rotate over HTTP."""
    import urllib.error
    import urllib.request

    from meshd.gateway.auth import find_gateway

    gw = find_gateway(args.socket)
    if args.http_cmd == "url":
        print(gw.url)
        return 0
    req = urllib.request.Request(gw.url + "v1/token/rotate", data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {gw.token}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = json.loads(resp.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"meshctl: cannot rotate the token at {gw.url}: {exc}", file=sys.stderr)
        return 1
    print(f"token rotated; the new one is in {body.get('token_file')}")
    return 0


async def _deadletters(me: Any, args: argparse.Namespace) -> int:
    if args.dl_cmd == "list":
        letters = await me.admin("deadletters.list")
        if args.json:
            print_json(letters)
        else:
            for d in letters:
                d["when"] = time.strftime("%H:%M:%S", time.localtime(d["at"]))
            table(letters, ["seq", "when", "reason", "kind", "from", "to", "topic", "attempts", "detail"])
    elif args.dl_cmd == "show":
        letter = await me.admin("deadletters.show", seq=args.seq)
        letter["frames"] = [f.hex() if isinstance(f, bytes) else f for f in letter.get("frames", [])]
        print_json(letter)
    elif args.dl_cmd == "replay":
        if args.seq is None and not (args.reason or args.to or args.all):
            print("meshctl: say which: a SEQ, --reason CODE, --to AGENT or --all", file=sys.stderr)
            return 2
        filters: dict[str, Any] = {}
        if args.seq is not None:
            filters["seq"] = args.seq
        if args.reason:
            filters["reason"] = args.reason
        if args.to:
            filters["to"] = args.to
        result = await me.admin("deadletters.replay", **filters)
        print(f"replayed {result['replayed']} dead letter(s)")
    elif args.dl_cmd == "purge":
        result = await me.admin("deadletters.purge")
        print(f"purged {result['purged']} dead letter(s)")
    return 0


async def _tasks(me: Any, args: argparse.Namespace) -> int:
    """meshctl tasks list|show|cancel, through the daemon's task tools (docs/tasks.md)."""
    call = getattr(me, "call_tool", None)
    if call is None:
        print("meshctl: NOT_WIRED: this meshd has no tool calls (Agent.call_tool), so no task tools",
              file=sys.stderr)
        return 1
    if args.tasks_cmd == "list":
        query: dict[str, Any] = {"limit": args.limit}
        if args.state:
            query["state"] = args.state
        rows = list(await call("list_tasks", query))
        if args.json:
            print_json(rows)
            return 0
        for row in rows:
            row["note"] = str(row.get("why") or row.get("error") or "")[:60]
            row["plan"] = row.get("plan_id") or ""
        table(rows, ["id", "state", "title", "capability", "assignee", "attempts", "plan", "note"])
    elif args.tasks_cmd == "show":
        key = "plan_id" if str(args.id).startswith("p-") else "task_id"
        print_json(await call("task_status", {key: args.id}))
    elif args.tasks_cmd == "cancel":
        record = await call("cancel_task", {"task_id": args.id})
        print(f"{record.get('id', args.id)}: {record.get('state')}"
              + (f" ({record['error']})" if record.get("error") else ""))
    return 0
def _owner_group(path: Path) -> str:
    """The group that owns ``path`` or, if this user cannot even look at it, its nearest parent."""
    import grp

    for candidate in (path, *path.parents):
        try:
            gid = candidate.stat().st_gid
        except OSError:
            continue
        try:
            return grp.getgrgid(gid).gr_name
        except KeyError:
            return str(gid)
    return "meshd"


def socket_access_error(path: Path) -> str | None:
    """One line saying why this user cannot connect to the agent socket at ``path``, or None.

    ZeroMQ connects to ipc:// in the background and retries forever, so a socket this user may not
    open would only show as a time-out: meshctl tries a plain AF_UNIX connect first.
    """
    import getpass
    import socket as socket_mod

    probe = socket_mod.socket(socket_mod.AF_UNIX, socket_mod.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except PermissionError:
        group = _owner_group(path)
        return (f"meshctl: permission denied on {path}: add your user to the '{group}' group "
                f"(usermod -aG {group} {getpass.getuser()}) and log in again")
    except (FileNotFoundError, ConnectionRefusedError):
        return (f"meshctl: no meshd is listening on {path}: start it, or say where it listens with "
                "--socket PATH or MESHD_SOCKET")
    except OSError:
        return None  # anything else: let the client report it
    finally:
        probe.close()
    return None


async def _ctl(args: argparse.Namespace) -> int:
    from meshd.client import Agent

    name = args.as_name or f"meshctl-{os.getpid()}"
    agent_name = args.name if args.cmd == "agent" else name
    socket_path = args.socket or find_agent_socket()
    problem = socket_access_error(socket_path)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 1
    async with Agent(agent_name, socket=socket_path) as me:
        if args.cmd == "peers":
            peers = await me.peers()
            for row in peers:
                row["note"] = "DUPLICATE ID" if row.get("duplicate") else ""
            if args.all:  # discovered nodes that are not peers, with the fingerprint to compare
                peers += [r | {"note": r.get("fingerprint") or r.get("detail")}
                          for r in await me.admin("peers.discovered")]
            if args.json:
                print_json(peers)
            else:
                table(peers, ["node", "name", "state", "agents", "router", "last_seen_ago", "source",
                               "note"])
        elif args.cmd == "doctor":
            from meshd.cli.field import doctor_with_mdns, print_report

            return print_report(await doctor_with_mdns(me, args.listen), args.json)
        elif args.cmd == "agents":
            agents = [a for a in await me.agents() if not str(a.get("name", "")).startswith("meshctl-")]
            if not args.contracts:
                for a in agents:
                    a.pop("contracts", None)
            if args.json:
                print_json(agents)
            else:
                for a in agents:
                    a["caps"] = ",".join(a.get("capabilities") or [])
                    a["skills"] = skills_cell(a.get("contracts"))
                    a["site"] = str((a.get("metadata") or {}).get("site") or "")  # meshd bridge's proxies
                table(agents, ["name", "node_name", "node", "state", "caps"] +
                      (["site"] if any(a["site"] for a in agents) else []) +
                      (["skills"] if args.contracts else []))
        elif args.cmd == "describe":
            records = await me.describe(args.agent)
            if args.json:
                print_json(records)
            else:
                node = next((a.get("node_name") for a in await me.agents()
                             if a.get("name") == args.agent.partition("@")[0]), None)
                print("\n".join(describe_lines(args.agent, node, records)))
        elif args.cmd == "node":
            print_json(await me.node_info())
        elif args.cmd == "plugins":
            rows = plugin_rows((await me.node_info()).get("plugins") or {})
            if args.json:
                print_json(rows)
            else:
                table(rows, ["plugin", "hook", "calls", "total_ms", "cpu_ms", "mean_ms"])
        elif args.cmd == "send":
            await me.send(args.agent, args.topic, args.payload, priority=args.priority)
            await asyncio.sleep(0.05)  # let the daemon bounce an unknown name back
            if me.errors_received:
                return 1
        elif args.cmd == "request":
            reply = await me.request(args.agent, args.topic, args.payload, timeout=args.timeout,
                                     version=args.version, check=args.check, priority=args.priority)
            print_json(reply)
        elif args.cmd == "gather":
            targets = [t for t in args.to.split(",") if t] if args.to is not None else None
            g = me.gather(args.topic, args.payload, to=targets, capability=args.capability,
                          subscribers_of=args.subscribers_of, want=args.want, timeout=args.timeout,
                          priority=args.priority)
            async for reply in g:  # one JSON line per reply as it comes, then the summary
                print_json({"from": reply.sender, "payload": reply.payload})
            assert g.summary is not None
            print_json({"summary": g.summary.as_dict()})
            if not g.summary.replied:
                return 1
        elif args.cmd == "handoff":
            result = await me.handoff(args.agent, args.task_id, context=args.context,
                                      artifacts=args.artifacts, timeout=args.timeout)
            print_json({"accepted": result.accepted, "reason": result.reason, "data": result.data})
            if not result.accepted:
                return 3
        elif args.cmd == "publish":
            reached = await me.publish(args.topic, args.payload, reach=True, priority=args.priority)
            print(f"reached {reached} subscriber(s)")
        elif args.cmd == "deadletters":
            return await _deadletters(me, args)
        elif args.cmd == "top":
            return await run_top(me, args)
        elif args.cmd == "tasks":
            return await _tasks(me, args)
        elif args.cmd == "a2a":  # A2A agents on the LAN (meshd/bindings/a2a/ctl.py)
            from meshd.bindings.a2a import ctl as a2a_ctl

            return await a2a_ctl.run(me, args)
        elif args.cmd in ("tools", "approvals"):  # syscall tools (meshd/tools/ctl.py)
            from meshd.tools import ctl as tools_ctl

            return await tools_ctl.run(me, args)
        elif args.cmd in ("tail", "agent"):
            done = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, done.set)

            @me.on()
            def show(msg: Any) -> Any:
                line = {"kind": msg.kind, "from": msg.sender, "topic": msg.topic, "id": msg.id,
                        "payload": msg.payload, "ts": time.time()}
                if msg.tasks:
                    line["tasks"] = msg.tasks
                print_json(line)
                if msg.is_request and getattr(args, "echo", False):
                    return msg.payload
                return None

            for topic in getattr(args, "topics", []) or []:
                await me.subscribe(topic)
            await done.wait()
    return 0


def _key_as_operand(argv: list[str]) -> list[str]:
    """``keys trust NAME KEY``: a Z85 key may start with ``-`` (one key in ~85), which argparse
    would take for an option; put ``--`` before it so the key printed by ``keys show`` always
    works as it is pasted."""
    if "keys" in argv and "trust" in argv[argv.index("keys"):] and "--" not in argv:
        at = argv.index("trust", argv.index("keys")) + 2
        if at < len(argv) and argv[at].startswith("-") and argv[at] not in ("-h", "--help"):
            return [*argv[:at], "--", *argv[at:]]
    return argv


def meshctl_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshctl", description="talk to the local meshd")
    parser.add_argument("--socket", type=Path, default=None,
                        help="agent socket (default: $MESHD_SOCKET, $RUNTIME_DIRECTORY/meshd.sock, "
                             "/run/meshd/meshd.sock if /run/meshd exists, else the daemon's default "
                             f"{find_agent_socket({}, Path('/nonexistent/meshd.sock'))})")
    parser.add_argument("--as", dest="as_name", help="agent name meshctl registers as")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("peers", help="list known daemons")
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true",
                   help="also nodes discovered but not peers (untrusted key, other mesh, other protocol)")
    p = sub.add_parser("doctor", help="why this daemon does not see a node; exit 1 on a problem")
    p.add_argument("--json", action="store_true")
    p.add_argument("--listen", type=_listen_seconds, default=2.0, metavar="SECONDS",
                   help="count mDNS on each interface this long (0: off; default 2)")
    p = sub.add_parser("agents", help="list agents in the mesh")
    p.add_argument("--json", action="store_true")
    p.add_argument("--contracts", action="store_true",
                   help="with each agent's contracts (its typed topics; the JSON has the schemas)")
    p = sub.add_parser("describe", help="what an agent accepts: each skill, its fields, an example call")
    p.add_argument("agent")
    p.add_argument("--json", action="store_true", help="the contract records as they are")
    sub.add_parser("node", help="this daemon's identity and counters (JSON)")
    p = sub.add_parser("plugins", help="this daemon's plugins and the time spent in their hooks")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("send", help="fire-and-forget message")
    p.add_argument("agent")
    p.add_argument("topic")
    p.add_argument("payload", type=_json_arg)
    p.add_argument("--priority", type=int, default=5, choices=range(10), metavar="0-9",
                   help="0 (urgent, served first) to 9; default 5")
    p = sub.add_parser("request", help="request and print the reply as JSON")
    p.add_argument("agent")
    p.add_argument("topic")
    p.add_argument("payload", type=_json_arg)
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--version", default=None, help="the contract version the payload is written for")
    p.add_argument("--check", action="store_true",
                   help="check the payload against the agent's advertised contract before sending")
    p.add_argument("--priority", type=int, default=5, choices=range(10), metavar="0-9",
                   help="0 (urgent, served first) to 9; default 5")
    p = sub.add_parser("gather", help="request of many agents (scatter-gather): a JSON line per reply, "
                       "then a summary line; exit 1 if none replied")
    p.add_argument("topic")
    p.add_argument("payload", type=_json_arg)
    who = p.add_mutually_exclusive_group(required=True)
    who.add_argument("--to", help="comma-separated agent names")
    who.add_argument("--capability", help="every agent with this capability")
    who.add_argument("--subscribers-of", dest="subscribers_of", metavar="TOPIC",
                     help="every agent subscribed to TOPIC (exactly or by a pattern)")
    p.add_argument("--want", type=int, default=None, help="stop after this many replies")
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--priority", type=int, default=5, choices=range(10), metavar="0-9",
                   help="0 (urgent, served first) to 9; default 5")
    p = sub.add_parser("handoff", help="hand a task to an agent; prints its verdict (exit 3 if rejected)")
    p.add_argument("agent")
    p.add_argument("task_id")
    p.add_argument("--context", type=_json_arg, default=None, help="JSON")
    p.add_argument("--artifacts", type=_json_arg, default=None, help="JSON")
    p.add_argument("--timeout", type=float, default=30.0)
    p = sub.add_parser("publish", help="publish on a topic")
    p.add_argument("topic")
    p.add_argument("payload", type=_json_arg)
    p.add_argument("--priority", type=int, default=5, choices=range(10), metavar="0-9",
                   help="0 (urgent, served first) to 9; default 5")
    p = sub.add_parser("tail", help="subscribe and print JSON lines")
    p.add_argument("topics", nargs="+")
    p = sub.add_parser("agent", help="attach a named agent that prints what it receives")
    p.add_argument("name")
    p.add_argument("--echo", action="store_true", help="answer each request with its payload")
    t = sub.add_parser("top", help="live view of nodes and agents (state, context %%, queue depth)")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    t.add_argument("--count", type=int, default=None, help="stop after this many screens")
    t.add_argument("--once", action="store_true", help="print one screen, no clearing (scripts)")
    d = sub.add_parser("deadletters", help="undeliverable messages kept by this daemon")
    dsub = d.add_subparsers(dest="dl_cmd", required=True)
    dl = dsub.add_parser("list", help="list dead letters")
    dl.add_argument("--json", action="store_true")
    ds = dsub.add_parser("show", help="one dead letter in full (JSON)")
    ds.add_argument("seq", type=int)
    dr = dsub.add_parser("replay", help="send dead letters again")
    dr.add_argument("seq", type=int, nargs="?")
    dr.add_argument("--reason", help="all with this reason code (e.g. NO_SUCH_AGENT)")
    dr.add_argument("--to", help="all addressed to this agent")
    dr.add_argument("--all", action="store_true", help="every replayable dead letter")
    dsub.add_parser("purge", help="forget all dead letters")
    tk = sub.add_parser("tasks", help="tasks this daemon owns (docs/tasks.md)")
    tksub = tk.add_subparsers(dest="tasks_cmd", required=True)
    tl = tksub.add_parser("list", help="tasks, newest first")
    tl.add_argument("--state", choices=["pending", "ready", "running", "done", "failed", "cancelled"])
    tl.add_argument("--limit", type=int, default=50)
    tl.add_argument("--json", action="store_true")
    ts = tksub.add_parser("show", help="one task, or a plan (an id starting with p-), as JSON")
    ts.add_argument("id")
    tc = tksub.add_parser("cancel", help="cancel a task (its dependants fail)")
    tc.add_argument("id")
    k = sub.add_parser("keys", help="node keys and trusted keys (works on files; no daemon needed)")
    k.add_argument("--config", type=Path, help="meshd config file (for state_dir, authorized_keys_dir)")
    k.add_argument("--state-dir", type=Path)
    k.add_argument("--authorized-keys-dir", type=Path)
    ksub = k.add_subparsers(dest="keys_cmd", required=True)
    ksub.add_parser("show", help="print this node's public key (created if missing)")
    e = ksub.add_parser("export", help="write this node's public key certificate")
    e.add_argument("-o", "--output", help="file (default: stdout)")
    t = ksub.add_parser("trust", help="trust a node's public key (z85, hex, or a key file); without KEY, "
                        "the key the running daemon discovered for NAME (compare its fingerprint)")
    t.add_argument("name")
    t.add_argument("key", nargs="?")
    u = ksub.add_parser("untrust", help="stop trusting a node (by name or key)")
    u.add_argument("name")
    lst = ksub.add_parser("list", help="list trusted keys")
    lst.add_argument("--json", action="store_true")
    sec = ksub.add_parser("secret", help="create a new mesh secret file (trust_mode secret)")
    sec.add_argument("path")
    from meshd.tools import ctl as tools_ctl  # meshctl tools|approvals

    tools_ctl.add_parsers(sub)
    from meshd.bindings.a2a import ctl as a2a_ctl  # meshctl a2a list|trust (never imports the SDK)

    a2a_ctl.add_parsers(sub)
    h = sub.add_parser("http", help="the daemon's HTTP gateway (docs/http.md)")
    hsub = h.add_subparsers(dest="http_cmd", required=True)
    hsub.add_parser("url", help="print the gateway's URL (from http.json beside the socket)")
    ht = hsub.add_parser("token", help="the gateway's bearer token")
    htsub = ht.add_subparsers(dest="token_cmd", required=True)
    htsub.add_parser("rotate", help="make a new token; the old one stops working at once")
    sec.add_argument("--owner", metavar="USER",
                     help="give the file to USER and USER's group (root only), e.g. --owner meshd for the "
                          "systemd service")
    args = parser.parse_args(_key_as_operand(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="meshctl: %(message)s")
    if args.cmd == "http":
        try:
            return _http(args)
        except MeshError as exc:
            print(f"meshctl: {exc.code}: {exc.message}", file=sys.stderr)
            return 1
    if args.cmd == "keys":
        try:
            from meshd.cli.keys import run_keys

            return run_keys(args)
        except (ConfigError, KeyFileError) as exc:
            print(f"meshctl: {exc}", file=sys.stderr)
            return 2
        except PermissionError as exc:
            print(f"meshctl: {exc.filename}: {exc.strerror} (run it as the daemon's user, e.g. "
                  "runuser -u meshd -- meshctl keys ...)", file=sys.stderr)
            return 1
    try:
        return asyncio.run(_ctl(args))
    except MeshError as exc:
        print(f"meshctl: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(meshd_main())
