"""Syscall tools through real daemons on 127.0.0.1: the system agent, validation, messaging tools,
approval (held, allowed, denied, timed out), quotas, authorization, meshctl tools/approvals."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.errors import (
    ApprovalDenied,
    Forbidden,
    NoSuchTool,
    QuotaExceeded,
    RequestTimeout,
    ValidationFailed,
)
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until, wait_listed, wait_until
from meshd.wire.system_names import TOPIC_ANSWER, TOPIC_APPROVALS, system_agent_name

BUILTINS = {"ask_agent", "request_agent", "gather_agents", "list_agents", "describe_agent", "send_message",
            "publish",
            "spawn_agent", "create_task", "create_plan", "task_status", "wait_task", "list_tasks",
            "cancel_task"}


def config(tmp: Path, text: str) -> str:
    path = tmp / "meshd.toml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def meshctl(proc: MeshdProcess, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; "
                           "sys.exit(meshctl_main())", "--socket", str(proc.socket), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_tools_listed_with_schemas_and_system_agent_hidden(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("llm", socket=a.socket) as me, \
                Agent("worker", socket=a.socket, capabilities=["summarize"]) as worker:
            worker.set_telemetry(context_used_pct=42, tasks_summary="reading")
            tools = {t["name"]: t for t in await me.tools()}
            assert set(tools) == BUILTINS
            assert tools["list_agents"]["side_effects"] is False
            assert tools["send_message"]["side_effects"] is True
            assert tools["send_message"]["input_schema"]["required"] == ["agent", "topic"]
            openai = await me.tools(format="openai")
            assert {t["function"]["name"] for t in openai} == BUILTINS and openai[0]["type"] == "function"
            anthropic = await me.tools(format="anthropic")
            assert all("input_schema" in t for t in anthropic)
            assert all("inputSchema" in t for t in await me.tools(format="mcp"))
            with pytest.raises(ValidationFailed, match="schema format"):
                await me.tools(format="nope")

            async def worker_reports() -> Any:
                listed = await me.call_tool("list_agents", {"capability": "summarize"})
                return listed if listed and listed[0]["context_used_pct"] == 42 else None
            listed = await async_wait_until(worker_reports, what="the worker's telemetry")
            assert [r["name"] for r in listed] == ["worker"]
            assert listed[0]["state"] == "online" and listed[0]["tasks"] == "reading"
            names = {r["name"] for r in await me.agents()}
            assert names == {"llm", "worker"}  # the system agent is not listed
            with pytest.raises(NoSuchTool, match="nope"):
                await me.call_tool("nope", {})

    asyncio.run(scenario())


def test_reserved_prefix_is_refused(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        with pytest.raises(ValidationFailed, match="reserved"):
            async with Agent(system_agent_name("fake"), socket=a.socket):
                pass
        # a forged token in the metadata does not help
        with pytest.raises(ValidationFailed, match="reserved"):
            async with Agent(system_agent_name(a.node_id), socket=a.socket,
                             metadata={"meshd.sys.token": "guess"}):
                pass

    asyncio.run(scenario())


def test_bad_arguments_name_the_field_and_nothing_happens(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("llm", socket=a.socket) as me, Agent("worker", socket=a.socket) as worker:
            got: asyncio.Queue[Any] = asyncio.Queue()
            worker.on("note")(lambda msg: got.put_nowait(msg.payload))
            with pytest.raises(ValidationFailed, match="'agent'"):
                await me.call_tool("send_message", {"topic": "note", "payload": "bad-1"})
            with pytest.raises(ValidationFailed, match="'surprise'"):
                await me.call_tool("send_message", {"agent": "worker", "topic": "note", "payload": "bad-2",
                                                    "surprise": 1})
            with pytest.raises(ValidationFailed, match="'timeout_s'"):
                await me.call_tool("request_agent", {"agent": "worker", "topic": "x", "timeout_s": -1})
            sent = await me.call_tool("send_message", {"agent": "worker", "topic": "note", "payload": "good"})
            assert sent["sent"] is True
            # the daemon keeps order per sender: had a bad call sent anything, it would come first
            assert await asyncio.wait_for(got.get(), 10) == "good"
            assert got.empty()

    asyncio.run(scenario())


def test_messaging_tools_across_daemons(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("llm", socket=a.socket) as me, \
                Agent("expert", socket=b.socket, capabilities=["answer"]) as expert:
            seen: list[Any] = []

            @expert.on("question")
            async def question(msg: Any) -> Any:
                seen.append((msg.payload, msg.headers))
                return f"answer to {msg.payload}"

            answers: asyncio.Queue[Any] = asyncio.Queue()
            me.on(TOPIC_ANSWER)(lambda msg: answers.put_nowait(msg.payload))
            await wait_listed(me, "expert")
            reply = await me.call_tool("request_agent", {"agent": "expert", "topic": "question",
                                                         "payload": "q1", "timeout_s": 10})
            assert reply == "answer to q1"
            accepted = await me.call_tool("ask_agent", {"agent": "expert", "question": "q2"})
            assert accepted["accepted"] is True and accepted["message_id"]
            answer = await asyncio.wait_for(answers.get(), 10)
            assert answer["id"] == accepted["message_id"] and answer["answer"] == "answer to q2"
            assert seen[0] == ("q1", {"meshd-caller": "llm"})
            # an unknown agent comes back typed, through the tool
            missing = await me.call_tool("ask_agent", {"agent": "nobody", "question": "q3"})
            answer = await asyncio.wait_for(answers.get(), 10)
            assert answer["id"] == missing["message_id"] and answer["error"]["code"] == "NO_SUCH_AGENT"

    asyncio.run(scenario())


def test_held_call_allowed_denied_and_timed_out(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    conf = config(tmp_path, """
        [tools]
        approval = { send_message = "hold", publish = "deny" }
        approval_timeout = 3.0
    """)
    a = meshd_factory.spawn("a", "--config", conf)

    async def scenario() -> None:
        async with Agent("llm", socket=a.socket) as me, Agent("worker", socket=a.socket) as worker, \
                Agent("person", socket=a.socket) as person:
            got: asyncio.Queue[Any] = asyncio.Queue()
            worker.on("note")(lambda msg: got.put_nowait(msg.payload))
            sys_agent = system_agent_name(str(me.node))
            await me.tools()  # waits for the system agent (it registers last, after READY)

            async def held() -> list[dict[str, Any]]:
                return list(await person.request(sys_agent, TOPIC_APPROVALS, {"op": "list"}, timeout=5))

            async def decide_next(op: str) -> dict[str, Any]:
                waiting = await async_wait_until(held, what="a held call")
                assert waiting[0]["tool"] == "send_message" and waiting[0]["caller"] == "llm"
                # the caller cannot decide its own call
                with pytest.raises(Forbidden):
                    await me.request(sys_agent, TOPIC_APPROVALS, {"op": "allow", "id": waiting[0]["id"]})
                return dict(await person.request(sys_agent, TOPIC_APPROVALS,
                                                 {"op": op, "id": waiting[0]["id"], "reason": "not now"}))

            args = {"agent": "worker", "topic": "note", "payload": "held-then-allowed"}
            call = asyncio.ensure_future(me.call_tool("send_message", args, timeout=10))
            decided = await decide_next("allow")
            assert decided["decision"] == "allow" and decided["by"] == "person"
            assert (await call)["sent"] is True
            assert await asyncio.wait_for(got.get(), 10) == "held-then-allowed"

            call = asyncio.ensure_future(me.call_tool("send_message", args | {"payload": "denied"},
                                                      timeout=10))
            await decide_next("deny")
            with pytest.raises(ApprovalDenied, match="person: not now"):
                await call
            # no decision within approval_timeout (3 s): denied
            with pytest.raises(ApprovalDenied, match="no decision"):
                await me.call_tool("send_message", args | {"payload": "timed-out"}, timeout=10)
            # the caller's own deadline is shorter: it times out, and the held call is dropped (the
            # daemon's hold ends at that same deadline, so its denial may arrive first)
            with pytest.raises((RequestTimeout, ApprovalDenied)):
                await me.call_tool("send_message", args | {"payload": "caller-gave-up"}, timeout=1)
            await async_wait_until(lambda: _not(held), what="the held call dropped")
            # deny by config
            with pytest.raises(ApprovalDenied, match="config"):
                await me.call_tool("publish", {"topic": "news", "payload": 1})
            # tools without side effects are never held
            assert isinstance(await me.call_tool("list_agents", {}), list)
            # nothing denied or timed out was delivered: the next message the worker gets is this one
            await me.send("worker", "note", "last")
            assert await asyncio.wait_for(got.get(), 10) == "last"

    asyncio.run(scenario())


async def _not(predicate: Any) -> bool:
    return not await predicate()


def test_meshctl_approvals_and_tools(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    conf = config(tmp_path, """
        [tools]
        default_approval = "hold"
    """)
    a = meshd_factory.spawn("a", "--config", conf)

    listed = meshctl(a, "tools", "list")
    assert listed.returncode == 0, listed.stderr
    assert "send_message" in listed.stdout and "list_agents" in listed.stdout
    for fmt, key in (("openai", "function"), ("anthropic", "input_schema"), ("mcp", "inputSchema")):
        out = meshctl(a, "tools", "schema", "--format", fmt)
        assert out.returncode == 0, out.stderr
        schemas = json.loads(out.stdout)
        assert len(schemas) == len(BUILTINS) and all(key in s for s in schemas)
    out = meshctl(a, "tools", "call", "list_agents", "{}")
    assert out.returncode == 0 and [r["name"][:8] for r in json.loads(out.stdout)] == ["meshctl-"]
    out = meshctl(a, "tools", "call", "send_message", '{"topic": "x"}')
    assert out.returncode == 1 and "VALIDATION_FAILED" in out.stderr and "'agent'" in out.stderr

    held = subprocess.Popen([sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; "
                             "sys.exit(meshctl_main())", "--socket", str(a.socket), "--as", "caller",
                             "tools", "call", "publish", '{"topic": "t", "payload": 1}'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def held_id() -> str | None:
            out = meshctl(a, "approvals", "list", "--json")
            rows = json.loads(out.stdout) if out.returncode == 0 else []
            return rows[0]["id"] if rows else None
        approval_id = wait_until(held_id, 15, 0.2, what="a held call in meshctl approvals list")
        out = meshctl(a, "approvals", "allow", approval_id)
        assert out.returncode == 0, out.stderr
        stdout, stderr = held.communicate(timeout=15)
        assert held.returncode == 0, stderr
        assert json.loads(stdout) == {"reached": 0}
        out = meshctl(a, "approvals", "deny", approval_id)
        assert out.returncode == 1 and "NO_SUCH_APPROVAL" in out.stderr
    finally:
        if held.poll() is None:
            held.kill()
            held.wait(5)


def test_call_quota(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    conf = config(tmp_path, """
        [tools]
        calls_per_minute = 3
    """)
    a = meshd_factory.spawn("a", "--config", conf)

    async def scenario() -> None:
        async with Agent("llm", socket=a.socket) as me, Agent("other", socket=a.socket) as other:
            for _ in range(3):
                await me.call_tool("list_agents", {})
            with pytest.raises(QuotaExceeded, match="calls_per_minute") as info:
                await me.call_tool("list_agents", {})
            assert info.value.retryable and info.value.retry_after is not None and info.value.retry_after > 0
            # the quota is per agent
            assert isinstance(await other.call_tool("list_agents", {}), list)

    asyncio.run(scenario())


AUTHZ_PLUGIN = '''
import json, os
from meshd.hookspecs import hookimpl

@hookimpl
def meshd_authorize(action, subject, target, topic):
    if action == "tool" and subject == "intruder":
        return "intruders call no tools"
    if action == "message" and target == "vault":
        return False
    return None

@hookimpl
def meshd_tool_event(event):
    with open(os.environ["TOOL_EVENTS"], "a") as fh:
        fh.write(json.dumps(event) + "\\n")
'''


def test_authorization_hook_forbids_and_observers_see_it(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    (tmp_path / "authz_plugin.py").write_text(AUTHZ_PLUGIN)
    events = tmp_path / "events.jsonl"
    conf = config(tmp_path, 'plugins = ["authz_plugin"]\n')
    a = meshd_factory.spawn("a", "--config", conf,
                            env={"PYTHONPATH": str(tmp_path), "TOOL_EVENTS": str(events)})

    async def scenario() -> None:
        async with Agent("intruder", socket=a.socket) as intruder, Agent("llm", socket=a.socket) as me, \
                Agent("vault", socket=a.socket):
            with pytest.raises(Forbidden, match="intruders call no tools"):
                await intruder.call_tool("list_agents", {})
            with pytest.raises(Forbidden, match="vault"):
                await me.call_tool("send_message", {"agent": "vault", "topic": "t", "payload": 1})
            assert isinstance(await me.call_tool("list_agents", {}), list)

    asyncio.run(scenario())

    def logged() -> list[dict[str, Any]]:
        return [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    wait_until(lambda: len(logged()) >= 3, what="tool events")
    kinds = [(e["event"], e["tool"], e["caller"]) for e in logged()]
    assert ("forbidden", "list_agents", "intruder") in kinds
    assert ("failed", "send_message", "llm") in kinds
    assert ("called", "list_agents", "llm") in kinds


DUP_PLUGIN = '''
from pydantic import BaseModel
from meshd.hookspecs import hookimpl
from meshd.tools import Tool

class NoArgs(BaseModel):
    pass

async def handler(args, ctx):
    return "mine"

@hookimpl
def meshd_tools():
    return [Tool("list_agents", "A second list_agents.", NoArgs, handler)]
'''


def test_duplicate_tool_name_stops_startup_naming_both(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    (tmp_path / "dup_tools.py").write_text(DUP_PLUGIN)
    conf = config(tmp_path, 'plugins = ["dup_tools"]\n')
    a = meshd_factory.spawn("a", "--config", conf, env={"PYTHONPATH": str(tmp_path)}, wait=False)
    assert a.proc is not None
    assert a.proc.wait(20) == 2
    log = a.log()
    assert "'list_agents'" in log and "meshd.builtin_tools" in log and "dup_tools" in log
    assert not a.socket.exists()
