"""One question, one trace: OpenTelemetry context across an HTTP edge and three real daemons.

The agents run in processes of their own (tests/integration/traced_agents.py), each with the SDK
and an in-memory exporter; the daemons run without an SDK and carry ``traceparent`` untouched.
The HTTP caller is any program that speaks W3C trace context: it sends a ``traceparent`` header.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp

from meshd.tasks import TASK_TOPIC
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until

AGENTS = Path(__file__).with_name("traced_agents.py")


class AgentProcess:
    """One traced_agents.py process: started, awaited ``ready``, asked for its spans."""

    def __init__(self, role: str, proc: MeshdProcess, *extra: str) -> None:
        self.role = role
        self.args = [sys.executable, str(AGENTS), role, "--socket", str(proc.socket), *extra]
        self.child: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []

    async def start(self) -> AgentProcess:
        self.child = await asyncio.create_subprocess_exec(
            *self.args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(AGENTS.parent)})
        assert self.child.stdout is not None
        while True:
            line = (await asyncio.wait_for(self.child.stdout.readline(), 30)).decode()
            assert line, f"{self.role} exited before it was ready"
            if line.strip() == "ready":
                return self
            self.lines.append(line.strip())

    async def spans(self) -> list[dict[str, Any]]:
        assert self.child is not None and self.child.stdin is not None
        self.child.stdin.write(b"dump\n")
        await self.child.stdin.drain()
        out, _ = await asyncio.wait_for(self.child.communicate(), 30)
        assert self.child.returncode == 0, f"{self.role} exited {self.child.returncode}"
        return [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]

    async def command(self, line: str) -> str:
        """Send one command line; returns the process's answer line."""
        assert self.child is not None and self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(line.encode() + b"\n")
        await self.child.stdin.drain()
        answer = (await asyncio.wait_for(self.child.stdout.readline(), 30)).decode().strip()
        assert answer, f"{self.role} exited on {line!r}"
        return answer

    def kill(self) -> None:
        if self.child is not None and self.child.returncode is None:
            self.child.kill()


def one(spans: list[dict[str, Any]], name: str, **attrs: Any) -> dict[str, Any]:
    found = [s for s in spans if s["name"] == name
             and all(s["attributes"].get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, f"{name} {attrs}: {len(found)} spans in {[s['name'] for s in spans]}"
    return found[0]


def test_one_request_through_gateway_three_daemons_and_a_delegation_is_one_trace(
        meshd_factory: MeshdFactory) -> None:
    asyncio.run(one_request_one_trace(meshd_factory))


async def one_request_one_trace(meshd_factory: MeshdFactory) -> None:
    a, b, c = (meshd_factory.spawn(n) for n in ("a", "b", "c"))
    meshd_factory.wait_mesh([a, b, c])
    verifier = researcher = None
    try:
        verifier = await AgentProcess("verifier", c).start()
        researcher = await AgentProcess("researcher", b).start()
        gw = a.gateway()
        trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
        async with aiohttp.ClientSession() as http:
            auth = {"Authorization": f"Bearer {gw.token}"}
            async with http.post(gw.url + "v1/agents/register", json={"name": "planner"}, headers=auth) as r:
                assert r.status == 200
                sid = (await r.json())["session_id"]
            async with http.post(gw.url + "v1/request", headers={
                    **auth, "traceparent": f"00-{trace_id}-{caller_span}-01", "tracestate": "planner=1"},
                    json={"session_id": sid, "target": "researcher", "topic": "research",
                          "payload": "the moon is far", "timeout": 20}) as r:
                body = await r.json()
                assert r.status == 200, body
        assert body["payload"]["report"] == "written"
        assert body["payload"]["input"]["checked"] == {"verified": True, "doubt": "HandlerError"}
        spans = await researcher.spans() + await verifier.spans()
    finally:
        for p in (researcher, verifier):
            if p is not None:
                p.kill()
    for s in spans:
        print(f"{s['name']:24} {s['kind']:9} {s['span_id']} <- {s['parent_id']} links={s['links']}"
              f" error={s['attributes'].get('error.type')}")

    assert {s["trace_id"] for s in spans} == {trace_id}, "every span belongs to the caller's trace"
    by_id = {s["span_id"]: s for s in spans}

    # researcher, on daemon b: its handler's span is the HTTP caller's child (through daemon a)
    process = one(spans, "process research", **{"messaging.client.id": "researcher"})
    assert process["kind"] == "CONSUMER" and process["parent_id"] == caller_span
    assert process["links"] == [caller_span]
    assert process["attributes"]["messaging.system"] == "meshd"
    assert process["attributes"]["messaging.operation.type"] == "process"
    assert process["attributes"]["messaging.destination.name"] == "research"
    assert process["attributes"]["meshd.sender"] == "planner"

    # its nested requests to the verifier on daemon c, and those handlers under them
    asks = [s for s in spans if s["name"] == "request verifier"]
    assert len(asks) == 2
    ok_ask = next(s for s in asks if "error.type" not in s["attributes"])
    failed_ask = next(s for s in asks if "error.type" in s["attributes"])
    for s in asks:
        assert s["kind"] == "PRODUCER" and s["parent_id"] == process["span_id"]
        assert s["attributes"]["messaging.operation.type"] == "send"
        assert s["attributes"]["messaging.client.id"] == "researcher"
        assert s["attributes"]["messaging.message.conversation_id"] == s["attributes"]["messaging.message.id"]
    verify = one(spans, "process verify")
    assert verify["parent_id"] == ok_ask["span_id"] and verify["status"] == "UNSET"
    replies = [s for s in spans if s["name"] == "reply researcher"]
    assert {by_id[s["parent_id"]]["name"] for s in replies} == {"process verify", "process doubt"}

    # the failed hop: the verifier's handler raised; both sides say HANDLER_ERROR
    doubt = one(spans, "process doubt")
    assert doubt["parent_id"] == failed_ask["span_id"]
    assert doubt["status"] == "ERROR" and doubt["attributes"]["error.type"] == "HANDLER_ERROR"
    assert failed_ask["status"] == "ERROR" and failed_ask["attributes"]["error.type"] == "HANDLER_ERROR"
    failed_reply = next(s for s in replies if by_id[s["parent_id"]]["name"] == "process doubt")
    assert failed_reply["attributes"]["error.type"] == "HANDLER_ERROR"

    # the delegation keeps the trace: the writer's handler is under the researcher's
    delegate = one(spans, "delegate writer")
    assert delegate["kind"] == "PRODUCER" and delegate["parent_id"] == process["span_id"]
    write = one(spans, "process research", **{"messaging.client.id": "writer"})
    assert write["parent_id"] == delegate["span_id"] and write["links"] == [delegate["span_id"]]
    correlation = process["attributes"]["messaging.message.conversation_id"]
    assert write["attributes"]["messaging.message.conversation_id"] == correlation
    # the writer answers the original requester, the HTTP caller's session on daemon a
    answer = one(spans, "reply planner")
    assert answer["parent_id"] == write["span_id"]


def test_mcp_meta_traceparent_reaches_a_task_on_another_daemon(meshd_factory: MeshdFactory) -> None:
    asyncio.run(mcp_task_one_trace(meshd_factory))


async def mcp_task_one_trace(meshd_factory: MeshdFactory) -> None:
    """An MCP client's ``_meta.traceparent`` on ``create_task``: through ``meshd mcp`` (no SDK),
    the daemon's tool service, the task's stored record and its dispatch to a worker on another
    daemon, the worker's handler span is that call's child."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    a, b = meshd_factory.spawn("a"), meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    trace_id, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    worker = None
    try:
        worker = await AgentProcess("worker", b).start()
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "meshd", "mcp", "--socket", str(a.socket), "--name", "claude"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            meta: Any = {"traceparent": f"00-{trace_id}-{caller_span}-01"}
            created = await session.call_tool("create_task", {"title": "sum up", "input": "long text",
                                                              "capability": "summarize"}, meta=meta)
            assert not created.is_error, created.content
            task = json.loads(created.content[0].text)
            done = await session.call_tool("wait_task", {"task_id": task["id"], "timeout_s": 30})
            assert json.loads(done.content[0].text)["state"] == "done"
        spans = await worker.spans()
    finally:
        if worker is not None:
            worker.kill()
    process = one(spans, f"process {TASK_TOPIC}")
    assert process["trace_id"] == trace_id and process["parent_id"] == caller_span
    assert process["attributes"]["messaging.client.id"] == "worker"
    reply = one(spans, f"reply {process['attributes']['meshd.sender']}")  # to the daemon's scheduler
    assert reply["parent_id"] == process["span_id"] and "error.type" not in reply["attributes"]


def test_qos1_send_redelivered_after_kill_9_keeps_its_trace(meshd_factory: MeshdFactory,
                                                            tmp_path: Path) -> None:
    asyncio.run(qos1_redelivered_keeps_trace(meshd_factory, tmp_path))


async def qos1_redelivered_keeps_trace(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """The receiving daemon is frozen when the send is stored, then killed -9 and restarted: the
    sending daemon's outbox delivers the stored copy, with the headers it had, so the handler's
    span is in the sender's trace."""
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    out = tmp_path / "seen.jsonl"
    out.touch()
    receiver = sender = None
    try:
        receiver = await AgentProcess("receiver", b, "--qos-out", str(out)).start()
        sender = await AgentProcess("sender", a).start()
        os.kill(b.pid, signal.SIGSTOP)  # b takes nothing in: the copy waits in a's outbox
        trace_id = await sender.command("send")
        b.kill()
        b.start()

        async def handled() -> bool:
            return bool(out.read_text().strip())
        await async_wait_until(handled, 30, 0.1, what="the stored send to reach the receiver")
        seen = [json.loads(line) for line in out.read_text().splitlines()]
        assert all(tp.split("-")[1] == trace_id for tp in seen), (seen, trace_id)
        spans = await receiver.spans() + await sender.spans()
    finally:
        for p in (receiver, sender):
            if p is not None:
                p.kill()
    produced = one(spans, "send receiver")
    assert produced["trace_id"] == trace_id and produced["kind"] == "PRODUCER"
    processed = [s for s in spans if s["name"] == "process job"]
    assert processed and all(s["trace_id"] == trace_id and s["parent_id"] == produced["span_id"]
                             for s in processed)
    # the qos-1 ack to the receiving daemon is a settle span under the handler's span
    acks = [s for s in spans if s["name"] == "ack receiver"]
    assert acks and {s["parent_id"] for s in acks} <= {s["span_id"] for s in processed}
    assert all(s["attributes"]["messaging.operation.type"] == "settle" for s in acks)


def test_a2a_http_traceparent_becomes_the_mesh_messages(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """An A2A client's W3C trace context (HTTP headers of SendMessage) reaches the mesh agent's
    message headers through ``meshd a2a`` on another daemon (no SDK anywhere: carried as is)."""
    import httpx
    from a2a.client import A2ACardResolver
    from a2a.types import SendMessageRequest
    from test_a2a import a2a_http, client_for, meshd_a2a, served, user_message

    from meshd import Agent

    a, b = meshd_factory.spawn("a"), meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    traceparent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    seen: dict[str, Any] = {}

    async def scenario(info: dict[str, Any]) -> None:
        async with Agent("expert", socket=b.socket) as expert, a2a_http(info) as http:
            @expert.on("a2a.message")
            def answer(msg: Any) -> Any:
                seen.update(msg.headers)
                return {"ok": True}

            await served(http, info, "expert")
            async with httpx.AsyncClient() as anonymous:
                card = await A2ACardResolver(anonymous, info["url"] + "/agents/expert").get_agent_card()
            http.headers["traceparent"] = traceparent
            http.headers["tracestate"] = "vendor=1"
            client = client_for(http, card, "JSONRPC", streaming=False)
            [only] = [e async for e in client.send_message(SendMessageRequest(message=user_message("q")))]
            assert only.task.id

    with meshd_a2a(a, tmp_path) as info:
        asyncio.run(scenario(info))
    assert seen.get("traceparent") == traceparent and seen.get("tracestate") == "vendor=1", seen
