"""An agent process with its node embedded (meshd.daemon.embedded), for the embedded-node tests.

    python embedded_agents.py ROLE [role options] -- [meshd run flags]

The flags after ``--`` are ``meshd run``'s (``--name``, ``--mesh``, ``--state-dir``, ``--socket``,
``--interface``, ``--insecure``, ...): the process builds its settings exactly as ``meshd run``
does, starts an ``EmbeddedNode`` in its loop (READY=1 on $NOTIFY_SOCKET once started, like the
daemon) and attaches its agent in-process. Roles:

* ``node``: no agent of its own; serves until SIGTERM (a restarted node resuming its outbox).
* ``echo --agent NAME --out FILE``: handles request ``echo`` (returns the payload), send ``note``
  and publications on ``news`` (each appends one JSON line ``[topic, payload]`` to FILE), and
  request ``relay`` (payload ``{"to": AGENT}``): requests ``echo`` of AGENT, sends it ``note``,
  publishes ``news2`` with ``reach=True``, and returns ``{"reply": ..., "reach": n}``.
* ``sender`` / ``receiver``: tests/integration/qos_agents.py's qos-1 roles (same options, minus
  ``--socket``; ``--kill-at`` kills this process), with the agent attached to this process's
  embedded node; the receiver registers its handler before it connects.

The ``EmbeddedProcess`` class at the end runs this script with ``meshd.testing.MeshdProcess``'s
conveniences (``query`` over the node's agent socket, ``wait_ready``, keys, ``kill``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

from meshd import Agent
from meshd.daemon.embedded import EmbeddedNode
from meshd.testing import MeshdProcess

HERE = Path(__file__).resolve().parent


def _settings(flags: list[str]) -> Any:
    from meshd.cli import main as cli

    parser = argparse.ArgumentParser(prog="embedded_agents")
    cli._run_parser(parser.add_subparsers(dest="command"))
    settings = cli.settings_from_args(parser.parse_args(["run", *flags]))
    cli.setup_logging(settings.log_level, settings.log_format)  # into the log, as the daemon's
    return settings


async def _until_stopped(max_seconds: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), max_seconds)


async def echo(node: EmbeddedNode, args: argparse.Namespace) -> int:
    out = open(args.out, "a", buffering=1)  # noqa: SIM115, ASYNC230 - line buffered, one write per message
    async with node.agent(args.agent, heartbeat_interval=0.25) as me:
        def record(msg: Any) -> None:
            out.write(json.dumps([msg.topic, msg.payload]) + "\n")

        me.on("note")(record)
        me.on("news")(record)

        @me.on("echo")
        async def echo_(msg: Any) -> Any:
            return msg.payload

        @me.on("relay")
        async def relay(msg: Any) -> Any:
            to = msg.payload["to"]
            reply = await me.request(to, "echo", {"from": args.agent}, timeout=5)
            await me.send(to, "note", {"from": args.agent})
            reach = await me.publish("news2", {"from": args.agent}, reach=True)
            return {"reply": reply, "reach": reach}

        await me.subscribe("news")
        await _until_stopped(args.max_seconds)
    out.close()
    return 0


async def receiver(node: EmbeddedNode, args: argparse.Namespace) -> int:
    """qos_agents.py's receiver, with its handler registered before the agent connects (as
    docs/embedded.md asks: units waiting in a peer's outbox can arrive at once, and a unit on a
    topic with no handler yet would become a dead letter instead of a handled line)."""
    sys.path.insert(0, str(HERE))
    import qos_agents  # the qos-1 fault tests' job handler

    agent = node.agent(args.name, heartbeat_interval=args.heartbeat)
    out = open(args.out, "a", buffering=1)  # noqa: SIM115, ASYNC230 - line buffered: one write per run
    qos_agents.record_jobs(agent, out, args.kill_at)

    await agent.connect()
    Path(args.out + ".ready").write_text(f"{agent.node}\n")  # noqa: ASYNC240 - once, tiny
    await _until_stopped(args.max_seconds)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(agent.close(), 3)
    out.close()
    return 0


async def qos_sender(node: EmbeddedNode, args: argparse.Namespace) -> int:
    sys.path.insert(0, str(HERE))
    import qos_agents  # the qos-1 fault tests' sender role

    async def connect(args: argparse.Namespace, deadline: float) -> Agent:
        agent = node.agent(args.name, heartbeat_interval=args.heartbeat)
        await agent.connect()
        return agent

    qos_agents._connect = connect  # type: ignore[assignment] - the same role, attached in-process
    return int(await qos_agents.sender(args))


async def amain(role: str, args: argparse.Namespace, flags: list[str]) -> int:
    async with EmbeddedNode(_settings(flags)) as node:
        if role == "node":
            await _until_stopped(args.max_seconds)
            return 0
        if role == "echo":
            return await echo(node, args)
        return await (receiver(node, args) if role == "receiver" else qos_sender(node, args))


def main() -> int:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    role_argv, flags = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["node", "echo", "sender", "receiver"])
    ap.add_argument("--agent", default="emb")
    ap.add_argument("--out", default="/dev/null")
    ap.add_argument("--name", default="emb")
    ap.add_argument("--heartbeat", type=float, default=0.25)
    ap.add_argument("--max-seconds", type=float, default=300.0)
    ap.add_argument("--kill-at", type=int, default=-1)
    ap.add_argument("--kill-pid", type=int, default=0)
    ap.add_argument("--to", default="")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--pace", type=float, default=0.0)
    ap.add_argument("--send-timeout", type=float, default=4.0)
    ap.add_argument("--deadline", type=float, default=90.0)
    args = ap.parse_args(role_argv)
    return asyncio.run(amain(args.role, args, flags))


class EmbeddedProcess(MeshdProcess):
    """This script as a subprocess: an agent with its node embedded, driven like a daemon."""

    def __init__(self, name: str, mesh: str, workdir: Path, args: list[str], role: list[str],
                 secure: bool = False, env: dict[str, str] | None = None) -> None:
        super().__init__(name, mesh, workdir, args, secure=secure, env=env)
        self.role = list(role)

    def command(self) -> list[str]:
        meshd_run = super().command()
        flags = meshd_run[meshd_run.index("run") + 1:]
        return [sys.executable, str(HERE / "embedded_agents.py"), *self.role, "--", *flags]


if __name__ == "__main__":
    sys.exit(main())
