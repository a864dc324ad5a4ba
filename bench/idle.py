"""An idle client process of one system, for its resident memory: ``idle.py SYSTEM CFG_JSON``.

Imports only what that system's client needs (not the bench's helpers, which import zmq and
msgpack for everyone), connects, prints one JSON line ``{"event": "ready", "heavy": [...]}`` (the
daemon-side libraries the import pulled in) and waits until stdin closes or a line arrives; the
orchestrator reads VmRSS from /proc meanwhile. Everything stays on 127.0.0.1.
"""

from __future__ import annotations

import json
import sys
from typing import Any

# Libraries an agent process should not need: meshd's daemon side and its config/plugin stack.
HEAVY = ("zeroconf", "pydantic", "pluggy", "sqlite3", "meshd.daemon.node", "meshd.discovery", "meshd.qos1")


def ready() -> None:
    heavy = [m for m in HEAVY if m in sys.modules]
    sys.stdout.write(json.dumps({"event": "ready", "heavy": heavy}) + "\n")
    sys.stdout.flush()


async def until_stdin() -> None:
    import asyncio

    loop = asyncio.get_running_loop()
    done = loop.create_future()
    loop.add_reader(sys.stdin.fileno(), lambda: done.done() or done.set_result(None))
    await asyncio.wait_for(done, 120)


async def meshd_agent(cfg: dict[str, Any]) -> None:
    from meshd import Agent  # as the README writes it

    async with Agent(cfg["name"], socket=cfg["socket"]) as me:
        @me.on("idle")
        async def handler(msg: Any) -> None:
            return None

        ready()
        await until_stdin()


async def nats_client(cfg: dict[str, Any]) -> None:
    import nats

    nc = await nats.connect(cfg["url"], allow_reconnect=False, connect_timeout=5)

    async def handler(msg: Any) -> None:
        return None

    await nc.subscribe("idle", cb=handler)
    ready()
    await until_stdin()
    await nc.close()


def zenoh_peer(cfg: dict[str, Any]) -> None:
    import zenoh

    conf = zenoh.Config()
    conf.insert_json5("mode", json.dumps("peer"))
    conf.insert_json5("listen/endpoints", json.dumps([f"tcp/127.0.0.1:{int(cfg['port'])}"]))
    conf.insert_json5("scouting/multicast/enabled", "false")
    conf.insert_json5("scouting/gossip/enabled", "false")
    session = zenoh.open(conf)
    session.declare_subscriber("idle", lambda sample: None)
    ready()
    sys.stdin.readline()
    session.close()


def raw_pyzmq(cfg: dict[str, Any]) -> None:
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{int(cfg['port'])}")
    ready()
    sys.stdin.readline()
    ctx.destroy()


def main() -> None:
    system, cfg = sys.argv[1], json.loads(sys.argv[2])
    if system in ("meshd", "nats"):
        import asyncio  # only the asyncio clients pay for it
    if system == "meshd":
        asyncio.run(meshd_agent(cfg))
    elif system == "nats":
        asyncio.run(nats_client(cfg))
    elif system == "zenoh":
        zenoh_peer(cfg)
    elif system == "raw":
        raw_pyzmq(cfg)
    else:
        raise SystemExit(f"unknown system {system!r}")


if __name__ == "__main__":
    main()
