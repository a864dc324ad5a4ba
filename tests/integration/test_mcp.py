"""``meshd mcp`` driven by the official MCP SDK's own stdio client, against real daemons.

An LLM client with no meshd code: lists tools, calls list_agents, asks a Python agent on another
daemon (request_agent), answers a request that arrives for it (wait_message / reply_message),
reads the agent directory as a resource, and runs a plan across agents on two daemons (the last
needs the task service, meshd.tasks).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from meshd import Agent
from meshd.errors import QueueFull
from meshd.testing import MeshdFactory, MeshdProcess, wait_listed

pytest.importorskip("mcp", reason="the 'mcp' extra is not installed")

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


@contextlib.asynccontextmanager
async def mcp_session(proc: MeshdProcess, name: str, *extra: str) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "meshd", "mcp", "--socket", str(proc.socket), "--name", name, *extra])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def result_of(res: Any) -> Any:
    assert not res.is_error, res.content[0].text
    return json.loads(res.content[0].text)


def test_mcp_lists_tools_asks_across_daemons_and_answers(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("expert", socket=b.socket, capabilities=["answer"]) as expert, \
                mcp_session(a, "claude") as session:
            expert.set_telemetry(context_used_pct=12)

            @expert.on("question")
            async def question(msg: Any) -> Any:
                return {"answer": f"42 ({msg.payload})", "asked_by": msg.headers.get("meshd-caller")}

            await wait_listed(expert, "claude")
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert {"list_agents", "request_agent", "create_plan", "wait_message", "reply_message"} \
                <= set(tools)
            assert tools["request_agent"].input_schema["required"] == ["agent", "topic"]

            agents = result_of(await session.call_tool("list_agents", {}))
            by_name = {r["name"]: r for r in agents}
            assert by_name["expert"]["capabilities"] == ["answer"] and by_name["expert"]["node_name"] == "b"
            assert "claude" in by_name

            reply = result_of(await session.call_tool("request_agent", {
                "agent": "expert", "topic": "question", "payload": "life", "timeout_s": 10}))
            assert reply == {"answer": "42 (life)", "asked_by": "claude"}

            bad = await session.call_tool("request_agent", {"topic": "question"})
            text = bad.content[0].text
            assert bad.is_error and "VALIDATION_FAILED" in text and "'agent'" in text

            # a request for the MCP agent: the LLM reads it and answers
            pending = asyncio.ensure_future(expert.request("claude", "review", {"doc": "d1"}, timeout=20))
            msg = result_of(await session.call_tool("wait_message", {"timeout_s": 10}))
            assert msg["from"] == "expert" and msg["topic"] == "review" and msg["is_request"]
            assert result_of(await session.call_tool("reply_message", {"id": msg["id"], "payload": "lgtm"}))
            assert await pending == "lgtm"
            assert result_of(await session.call_tool("wait_message", {"timeout_s": 0.2})) is None

            resources = {str(r.uri) for r in (await session.list_resources()).resources}
            assert {"meshd://agents", "meshd://tasks", "meshd://tools"} <= resources
            read = await session.read_resource("meshd://agents")
            assert "expert" in {r["name"] for r in json.loads(read.contents[0].text)}

    asyncio.run(scenario())


def test_mcp_unread_messages_are_bounded(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with mcp_session(a, "slow-llm", "--inbox", "1") as session, \
                Agent("asker", socket=a.socket) as asker:
            await wait_listed(asker, "slow-llm")
            first = asyncio.ensure_future(asker.request("slow-llm", "q", 1, timeout=20))
            await asyncio.sleep(0)  # let the first request be queued first (FIFO per sender)
            # the first request waits unread until the LLM reads it: the inbox (1) is full
            with pytest.raises(QueueFull, match="unread"):
                await asker.request("slow-llm", "q", 2, timeout=20)
            msg = result_of(await session.call_tool("wait_message", {"timeout_s": 5}))
            assert msg["payload"] == 1
            await session.call_tool("reply_message", {"id": msg["id"], "payload": "one"})
            assert await first == "one"

    asyncio.run(scenario())


def test_mcp_without_the_extra_is_a_one_line_error(tmp_path: Any) -> None:
    blocker = tmp_path / "mcp.py"
    blocker.write_text("raise ImportError('mcp hidden by the test')\n")
    r = subprocess.run([sys.executable, "-m", "meshd", "mcp", "--socket", str(tmp_path / "none.sock")],
                       capture_output=True, text=True, timeout=30,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "meshd: the MCP server needs the 'mcp' extra: pip install 'meshd-daemon[mcp]'"]


def test_mcp_create_plan_across_daemons(meshd_factory: MeshdFactory) -> None:
    from meshd.tasks.worker import TaskWorker

    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    c = meshd_factory.spawn("c")
    meshd_factory.wait_mesh([a, b, c])

    async def scenario() -> None:
        ran: list[tuple[str, str]] = []

        def handler(who: str) -> Any:
            async def handle(task: Any) -> Any:
                ran.append((who, task.title))
                return f"{task.title} by {who}"
            return handle

        async with Agent("searcher", socket=b.socket, capabilities=["search"]) as searcher, \
                Agent("writer", socket=c.socket, capabilities=["write"]) as writer, \
                mcp_session(a, "planner") as session:
            TaskWorker(searcher, handler("searcher"))
            TaskWorker(writer, handler("writer"))
            await wait_listed(searcher, "writer", "planner")
            plan = result_of(await session.call_tool("create_plan", {"tasks": [
                {"id": "find", "title": "find sources", "capability": "search", "input": "topic"},
                {"id": "draft", "title": "write draft", "capability": "write", "deps": ["find"]},
            ]}))
            draft = next(t for t in plan["tasks"] if t.get("title") == "write draft")
            done = result_of(await session.call_tool("wait_task", {"task_id": draft["id"], "timeout_s": 30}))
            assert done["state"] == "done" and done["assignee"] == "writer"
            assert sorted(ran) == [("searcher", "find sources"), ("writer", "write draft")]

    asyncio.run(scenario())


def test_mcp_progress_for_a_held_call_and_wait_task_and_unknown_agent_at_once(
        meshd_factory: MeshdFactory, tmp_path: Any) -> None:
    """With the Python SDK's client: the progress notifications of a call held for
    approval and of wait_task (the daemon's notes, against the client's progressToken), and
    NO_SUCH_AGENT for request_agent's target at once, not after timeout_s."""
    import time

    from meshd.tasks.worker import TaskWorker
    from meshd.wire.system_names import TOPIC_APPROVALS, system_agent_name

    conf = tmp_path / "meshd.toml"
    conf.write_text('[tools]\napproval = { send_message = "hold" }\napproval_timeout = 30.0\n')
    a = meshd_factory.spawn("a", "--config", str(conf))

    async def scenario() -> None:
        release = asyncio.Event()

        async def slow_task(task: Any) -> Any:
            await release.wait()  # until the MCP client has heard that the task runs
            return "finished"

        async with Agent("person", socket=a.socket) as person, \
                Agent("worker", socket=a.socket, capabilities=["slow"]) as worker, \
                mcp_session(a, "llm") as session:
            TaskWorker(worker, slow_task)
            await wait_listed(person, "llm", "worker")

            started = time.monotonic()
            missing = await session.call_tool("request_agent",
                                              {"agent": "nobody", "topic": "q", "timeout_s": 5})
            elapsed = time.monotonic() - started
            assert missing.is_error and missing.content[0].text.startswith("NO_SUCH_AGENT"), missing
            assert elapsed < 3.0, elapsed  # at once (before the fix: the whole call timeout)

            notes: list[str] = []

            async def heard(progress: float, total: float | None, message: str | None) -> None:
                notes.append(message or "")
                if "running" in (message or ""):
                    release.set()

            async def allow_when_held() -> None:
                sys_agent = system_agent_name(str(person.node))

                async def held() -> list[dict[str, Any]]:
                    return list(await person.request(sys_agent, TOPIC_APPROVALS, {"op": "list"}, timeout=5))

                from meshd.testing import async_wait_until

                waiting = await async_wait_until(held, what="a held call")
                await person.request(sys_agent, TOPIC_APPROVALS, {"op": "allow", "id": waiting[0]["id"]})

            allowing = asyncio.ensure_future(allow_when_held())
            sent = await session.call_tool("send_message", {"agent": "worker", "topic": "n", "payload": 1},
                                           progress_callback=heard)
            await allowing
            assert result_of(sent)["sent"] is True
            assert any(n.startswith("held for approval") and "meshctl approvals allow" in n
                       for n in notes), notes

            notes.clear()
            task = result_of(await session.call_tool("create_task", {"title": "t", "capability": "slow"}))
            done = result_of(await session.call_tool("wait_task", {"task_id": task["id"], "timeout_s": 30},
                                                     progress_callback=heard))
            assert done["state"] == "done" and done["result"] == "finished", done
            assert any(n == f"task {task['id']}: running (assignee worker)" for n in notes), notes

            templates = (await session.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["meshd://tasks/{task_id}"]
            read = await session.read_resource(f"meshd://tasks/{task['id']}")
            assert json.loads(read.contents[0].text)["state"] == "done"
            from mcp.shared.exceptions import MCPError

            with pytest.raises(MCPError) as missing_resource:
                await session.read_resource("meshd://nothing")
            assert missing_resource.value.error.code == -32002  # the spec's "Resource not found"

    asyncio.run(scenario())


def test_mcp_2026_client_listens_to_the_inbox_and_times_out_on_time(meshd_factory: MeshdFactory) -> None:
    """The Python SDK's high-level Client negotiates the 2026-07-28 protocol (server/discover):
    a ``subscriptions/listen`` stream on meshd://inbox hears an arrival; a request_agent to an agent
    that never answers ends with TIMEOUT within its timeout_s, not the call's 125 s."""
    import time

    from mcp import Client
    from mcp.shared.subscriptions import ResourceUpdated

    a = meshd_factory.spawn("a")
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "meshd", "mcp", "--socket", str(a.socket), "--name", "modern"])

    async def scenario() -> None:
        async with Agent("sender", socket=a.socket) as sender, Client(params) as client:
            sender.on("mute")(lambda msg: asyncio.Event().wait())  # never answers
            assert client.session.protocol_version == "2026-07-28"
            await wait_listed(sender, "modern")
            async with client.listen(resource_subscriptions=["meshd://inbox"]) as sub:
                await sender.send("modern", "hello", {"n": 1})
                event = await asyncio.wait_for(anext(aiter(sub)), 10)
                assert event == ResourceUpdated(uri="meshd://inbox")
            inbox = json.loads((await client.read_resource("meshd://inbox")).contents[0].text)
            assert inbox["unread"] == 1 and inbox["messages"][0]["payload"] == {"n": 1}

            started = time.monotonic()
            res = await client.call_tool("request_agent",
                                         {"agent": "sender", "topic": "mute", "timeout_s": 1})
            assert res.is_error and res.content[0].text.startswith("TIMEOUT"), res
            assert time.monotonic() - started < 3.0

    asyncio.run(scenario())


def test_mcp_http_refuses_plain_http_on_a_lan_address_and_bad_tls_files(tmp_path: Any) -> None:
    """Checked before the agent attaches (no daemon needed): exit 2 with a one-line reason."""
    sock = str(tmp_path / "none.sock")
    missing = [str(tmp_path / "c.pem"), "--tls-key", str(tmp_path / "k.pem")]
    for extra, says in ((["--http", "10.1.2.3:8767"], "plain HTTP on 10.1.2.3"),
                        (["--http", "--tls-cert", *missing], "cannot load the certificate")):
        r = subprocess.run([sys.executable, "-m", "meshd", "mcp", "--socket", sock, *extra],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (extra, r.stderr)
        assert says in r.stderr and "Traceback" not in r.stderr, (extra, r.stderr)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_mcp_http_over_tls(meshd_factory: MeshdFactory, tmp_path: Any) -> None:
    import ssl
    import urllib.error
    import urllib.request

    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    a = meshd_factory.spawn("a")
    server = subprocess.Popen([sys.executable, "-m", "meshd", "mcp", "--socket", str(a.socket),
                               "--name", "tls", "--http", "127.0.0.1:0", "--tls-cert", str(cert),
                               "--tls-key", str(key)], stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        for line in server.stderr:  # it says where it listens once the socket is bound
            if "Streamable HTTP at" in line:
                break
        info = json.loads((a.socket.parent / "mcp-tls.json").read_text())
        token = (a.socket.parent / "mcp-tls.token").read_text().strip()
        assert info["url"].startswith("https://127.0.0.1:")
        ctx = ssl.create_default_context(cafile=str(cert))
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}}).encode()

        def post(headers: dict[str, str]) -> int:
            req = urllib.request.Request(info["url"], data=body, method="POST", headers={
                "content-type": "application/json", "accept": "application/json, text/event-stream",
                **headers})
            try:
                with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert post({}) == 401
        assert post({"authorization": f"Bearer {token}"}) == 200
    finally:
        server.terminate()
        assert server.wait(20) == 0
    assert not (a.socket.parent / "mcp-tls.token").exists()  # made at start, removed at exit
