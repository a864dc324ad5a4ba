"""A2A overhead, bounded (~30 s): the same request sent directly on the mesh and through ``meshd a2a``.

Two daemons on 127.0.0.1; agent "echo" on b; ``meshd a2a`` attached to a; the bench's own client
(agent "direct" on a, and the a2a-sdk client over HTTP to the binding). Rows (p50/p99 of N
sequential round trips, awaited one at a time, a fresh payload each):
  direct            Agent.request("echo", ...)                     agent -> a -> b -> agent
  a2a JSON-RPC      SendMessage, blocking, JSON-RPC binding         + HTTP, JSON, the SDK's task
  a2a HTTP+JSON     SendMessage, blocking, REST binding               machinery and the binding's
  a2a stream        SendStreamingMessage (SSE) to the final event     own hop to daemon a
Run: python bench/a2a_bench.py [N]
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types import Message, Part, Role, SendMessageRequest

from meshd import Agent
from meshd.testing import MeshdFactory, short_tempdir, wait_until


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(n: int, call: Any) -> list[float]:
    for i in range(20):  # warm-up
        await call(i)
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        await call(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def request(i: int) -> SendMessageRequest:
    return SendMessageRequest(message=Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex,
                                              parts=[Part(text=f"ping {i}")]))


async def drain(client: Any, i: int) -> None:
    async for _ in client.send_message(request(i)):
        pass


async def run(a: Any, b: Any, info: dict[str, Any], n: int) -> None:
    token = info["token"]
    async with Agent("direct", socket=a.socket) as me, Agent("echo", socket=b.socket) as echo, \
            httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        @echo.on("a2a.message")
        async def handle(msg: Any) -> Any:
            return msg.payload

        for _ in range(200):
            if "echo" in {x["name"] for x in (await http.get(info["catalog"])).json()["agents"]}:
                break
            await asyncio.sleep(0.05)
        card = await A2ACardResolver(http, info["url"] + "/agents/echo").get_agent_card()

        def client(binding: str, streaming: bool) -> Any:
            return ClientFactory(ClientConfig(streaming=streaming, httpx_client=http,
                                              supported_protocol_bindings=[binding])).create(card)

        jsonrpc, rest, stream = client("JSONRPC", False), client("HTTP+JSON", False), client("JSONRPC", True)
        rows = {
            "direct": await measure(n, lambda i: me.request("echo", "a2a.message", f"ping {i}", timeout=10)),
            "a2a JSON-RPC": await measure(n, lambda i: drain(jsonrpc, i)),
            "a2a HTTP+JSON": await measure(n, lambda i: drain(rest, i)),
            "a2a stream": await measure(n, lambda i: drain(stream, i)),
        }
    base = statistics.median(rows["direct"])
    print(f"{'path':<14} {'p50 us':>9} {'p99 us':>9} {'x direct':>9}   (N={n})")
    for name, samples in rows.items():
        p50 = statistics.median(samples)
        print(f"{name:<14} {p50:>9.0f} {pct(samples, 0.99):>9.0f} {p50 / base:>9.2f}")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    workdir = short_tempdir("mshd-ab-")
    factory = MeshdFactory(workdir)
    child = None
    try:
        a = factory.spawn("a", fast=False)
        b = factory.spawn("b", fast=False)
        factory.wait_mesh([a, b])
        conf = workdir / "a2a.toml"
        conf.write_text(f"[a2a]\nmax_tasks = {n * 8}\n")
        url_file = a.socket.parent / "a2a-a2a.json"
        child = subprocess.Popen([sys.executable, "-m", "meshd", "a2a", "--socket", str(a.socket), "--name",
                                  "a2a", "--listen", "127.0.0.1:0", "--config", str(conf)],
                                 stdout=subprocess.DEVNULL, stderr=(workdir / "a2a.log").open("w"))
        wait_until(url_file.exists, 30, what="meshd a2a's URL file")
        info = json.loads(url_file.read_text())
        info["token"] = Path(info["token_file"]).read_text().strip()
        asyncio.run(run(a, b, info, n))
    finally:
        if child is not None:
            child.terminate()
            child.wait(15)
        factory.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
