"""A client that is not Python (Node's fetch and a hand-written SSE reader) joins the mesh over HTTP.

It registers on daemon a, answers a request from a Python agent on daemon b, sends a prompt to
that Python agent and gets its response, receives a publication, drops its stream and resumes
with Last-Event-ID, getting what was published while it was away.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.testing import MeshdFactory, async_wait_until, wait_listed

NODE = shutil.which("node")
SCRIPT = Path(__file__).with_name("gateway_client.mjs")


@pytest.mark.skipif(NODE is None, reason="node (v18+, for its built-in fetch) is not installed")
def test_node_client_joins_the_mesh(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    gw = a.gateway()
    url, token = gw.url, gw.token
    assert NODE is not None
    proc = subprocess.Popen([NODE, str(SCRIPT), url, token, "node-agent", "py-b"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def step(expected: str) -> dict[str, Any]:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
        assert line, f"node exited early ({proc.poll()}): {proc.stderr.read() if proc.stderr else ''}"
        data = json.loads(line)
        if data.get("step") == "heartbeat_failed":
            return await step(expected)
        assert data["step"] == expected, data
        return dict(data)

    async def scenario() -> None:
        async with Agent("py-b", socket=b.socket) as py:
            @py.on("ask")
            async def ask(msg: Any) -> Any:
                return {"echo": msg.payload["prompt"], "to": msg.sender}

            await step("ready")
            await wait_listed(py, "node-agent")
            reply = await py.request("node-agent", "compute", {"q": 41}, timeout=10)
            assert reply == {"answer": 42, "by": "node-agent"}
            assert (await step("answered"))["from"] == "py-b"
            response = await step("response")
            assert response["ok"] is True
            assert response["payload"] == {"echo": "hello from node", "to": "node-agent"}

            async def published() -> bool:
                return await py.publish("news", {"n": 1}, reach=True) >= 1
            await async_wait_until(published, 10, interval=0.1, what="node-agent's subscription on b")
            assert (await step("publication"))["payload"] == {"n": 1}
            await step("disconnected")
            assert await py.publish("news", {"n": 2}, reach=True) >= 1  # it is still subscribed while away
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            resumed = await step("resumed")
            assert resumed["payload"] == {"n": 2}
            await step("done")

    try:
        asyncio.run(scenario())
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
