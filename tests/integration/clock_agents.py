"""An agent for the clock tests, run as a subprocess so it can live under libfaketime with the
daemon of the host whose clock is off (no behaviour may depend on hosts agreeing on the time):

    python clock_agents.py --socket S --name N [--ready FILE]

Registers N and touches FILE once registered; runs until SIGTERM. Topics:

* ``echo`` (request): answers ``{"left": msg.time_left, "payload": ...}``.
* ``delegate`` (request): delegates to ``payload["to"]`` on topic ``echo``.
* ``ask`` (request): makes a request of its own from this host, ``payload = {"to", "topic",
  "timeout", "payload"}``, and answers ``{"reply": ...}`` or ``{"error": code}``.
* ``note`` (send): sends ``{"n": payload["n"]}`` with qos 1 to ``payload["back"]`` on topic
  ``note-back`` (a qos-1 send from this host).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

from meshd import DEFER, Agent, Message
from meshd.errors import MeshError


async def main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Agent(args.name, socket=args.socket) as me:
        @me.on("echo")
        async def echo(msg: Message) -> Any:
            return {"left": msg.time_left, "payload": msg.payload}

        @me.on("delegate")
        async def delegate(msg: Message) -> Any:
            await me.delegate(msg, str(msg.payload["to"]), topic="echo")
            return DEFER

        @me.on("ask")
        async def ask(msg: Message) -> Any:
            p = msg.payload
            try:
                reply = await me.request(str(p["to"]), str(p["topic"]), p.get("payload"),
                                         timeout=float(p["timeout"]))
            except MeshError as exc:
                return {"error": exc.code}
            return {"reply": reply}

        @me.on("note")
        async def note(msg: Message) -> None:
            await me.send(str(msg.payload["back"]), "note-back", {"n": msg.payload["n"]}, qos=1)

        if args.ready:
            await asyncio.to_thread(Path(args.ready).touch)
        await stop.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--ready")
    asyncio.run(main(parser.parse_args()))
