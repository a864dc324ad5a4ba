"""``meshd a2a`` driven by the official ``a2a-sdk``'s own client and server, against real daemons.

An A2A client with no meshd code resolves a mesh agent's Agent Card and talks to a Python agent
on another daemon over both bindings (JSON-RPC, HTTP+JSON): SendMessage, SendStreamingMessage
(event order, progress notes, the stream ends at the terminal state), GetTask, ListTasks,
CancelTask on a running and a finished task, errors as documented in docs/a2a.md. And the other
way: an agent written with the SDK's server joins the mesh through ``[[a2a.remote_agents]]`` and a
Python mesh agent on another daemon calls it, streaming and cancelling.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.errors import Forbidden, PeerUnreachable, ValidationFailed
from meshd.testing import MeshdFactory, MeshdProcess, wait_listed, wait_until
from meshd.wire.system_names import TOPIC_APPROVALS, system_agent_name

pytest.importorskip("a2a", reason="the 'a2a' extra is not installed")

import httpx
import uvicorn
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import A2AError, TaskNotCancelableError
from google.protobuf.json_format import MessageToDict
from starlette.applications import Starlette

BINDINGS = ["JSONRPC", "HTTP+JSON"]


# ------------------------------------------------------------------------------------ helpers


@contextlib.contextmanager
def meshd_a2a(proc: MeshdProcess, tmp: Path, config: str = "", name: str = "a2a") -> Iterator[dict[str, Any]]:
    """A ``meshd a2a`` process on ``proc``'s daemon, on a free loopback port; yields its URL file
    (with the token read in) and stops it (SIGTERM) afterwards."""
    cfg = tmp / f"{name}.toml"
    cfg.write_text(config)
    url_file = proc.socket.parent / f"a2a-{name}.json"
    log = tmp / f"{name}.log"
    info: dict[str, Any] = {}
    child = subprocess.Popen([sys.executable, "-m", "meshd", "a2a", "--socket", str(proc.socket),
                              "--name", name, "--listen", "127.0.0.1:0", "--config", str(cfg)],
                             stdout=subprocess.DEVNULL, stderr=log.open("w"))
    try:
        wait_until(lambda: url_file.exists() or child.poll() is not None, 30, what="a2a URL file")
        assert child.poll() is None, log.read_text()
        info.update(json.loads(url_file.read_text()))
        info["token"] = Path(info["token_file"]).read_text().strip()
        info["log"] = log
        yield info
    finally:
        # Once only: a test that stopped it already must not send a second SIGTERM, which can
        # land after the server's own handlers are gone and kill it in the middle of its cleanup.
        if child.poll() is None and not info.get("stopped"):
            child.terminate()
        try:
            child.wait(15)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)
    assert not url_file.exists(), "the URL file outlived meshd a2a"


@contextlib.asynccontextmanager
async def a2a_http(info: dict[str, Any]) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {info['token']}"},
                                 timeout=httpx.Timeout(30.0)) as http:
        yield http


async def served(http: httpx.AsyncClient, info: dict[str, Any], *names: str) -> dict[str, Any]:
    """The catalog, once it lists ``names`` (the directory reaches the binding within a second)."""
    catalog: dict[str, Any] = {}
    for _ in range(200):
        catalog = (await http.get(info["catalog"])).json()
        if set(names) <= {a["name"] for a in catalog["agents"]}:
            return catalog
        await asyncio.sleep(0.05)
    raise AssertionError(f"{names} never listed: {catalog}")


def user_message(payload: Any = "life", **metadata: Any) -> Message:
    if isinstance(payload, str):
        parts = [Part(text=payload)]
    else:
        from google.protobuf import struct_pb2
        from google.protobuf.json_format import ParseDict
        parts = [Part(data=ParseDict(payload, struct_pb2.Value()))]
    return Message(role=Role.ROLE_USER, message_id=uuid.uuid4().hex, parts=parts, metadata=metadata or None)


def client_for(http: httpx.AsyncClient, card: AgentCard, binding: str, *, streaming: bool) -> Any:
    return ClientFactory(ClientConfig(streaming=streaming, httpx_client=http,
                                      supported_protocol_bindings=[binding])).create(card)


def error_data(status: Any) -> dict[str, Any]:
    """The typed error fields of a failed task's status message (docs/a2a.md, "Errors")."""
    for part in status.message.parts:
        if part.HasField("data"):
            return dict(MessageToDict(part.data))
    raise AssertionError(f"no data part in {status}")


def artifact_data(task: Any) -> Any:
    return MessageToDict(task.artifacts[0].parts[0].data)


def kind_of(event: Any) -> str:
    if event.HasField("task"):
        return f"task:{TaskState.Name(event.task.status.state)}"
    if event.HasField("status_update"):
        return TaskState.Name(event.status_update.status.state)
    if event.HasField("artifact_update"):
        return "artifact"
    return "message"


def expert_handlers(expert: Agent, seen: dict[str, Any]) -> None:
    seen.update(started=asyncio.Event(), cancelled=asyncio.Event())

    @expert.on("a2a.message")
    async def answer(msg: Any) -> Any:
        seen["payload"], seen["headers"], seen["time_left"] = msg.payload, msg.headers, msg.time_left
        await msg.progress("thinking")
        await msg.progress("almost")
        return {"answer": 42, "got": msg.payload}

    @expert.on("slow")
    async def slow(msg: Any) -> Any:
        seen["started"].set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            seen["cancelled"].set()
            raise
        return "late"

    @expert.on("boom")
    async def boom(msg: Any) -> Any:
        raise RuntimeError("the handler broke")


# ------------------------------------------------------------------------- mesh agents over A2A


@pytest.mark.parametrize("binding", BINDINGS)
def test_a2a_client_calls_a_mesh_agent_on_another_daemon(meshd_factory: MeshdFactory, tmp_path: Path,
                                                         binding: str) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    seen: dict[str, Any] = {}

    async def scenario(info: dict[str, Any]) -> None:
        async with Agent("expert", socket=b.socket, capabilities=["answer", "review"]) as expert, \
                Agent("other", socket=b.socket), a2a_http(info) as http:
            expert_handlers(expert, seen)
            catalog = await served(http, info, "expert", "other")
            names = {x["name"] for x in catalog["agents"]}
            assert "a2a" not in names and not any(n.startswith("meshd.sys.") for n in names)
            entry = next(x for x in catalog["agents"] if x["name"] == "expert")
            assert entry["url"] == info["url"] + "/agents/expert/.well-known/agent-card.json"

            # the card, resolved the SDK's way from the agent's base URL, with no token
            async with httpx.AsyncClient() as anonymous:
                card = await A2ACardResolver(anonymous, info["url"] + "/agents/expert").get_agent_card()
                refused = await anonymous.post(info["url"] + "/a2a/jsonrpc", json={})
                assert refused.status_code == 401 and "bearer" in refused.headers["www-authenticate"].lower()
            assert card.name == "expert" and card.capabilities.streaming
            assert [s.id for s in card.skills] == ["answer", "review"]
            assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
            assert {(i.protocol_binding, i.tenant) for i in card.supported_interfaces} == \
                {("JSONRPC", "expert"), ("HTTP+JSON", "expert")}

            # SendMessage: the reply as an artifact, COMPLETED; the mesh handler saw the payload
            client = client_for(http, card, binding, streaming=False)
            [only] = [e async for e in client.send_message(SendMessageRequest(
                message=user_message("life"), metadata={"timeout_s": 7}))]
            task = only.task
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert artifact_data(task) == {"answer": 42, "got": "life"}
            assert seen["payload"] == "life" and seen["headers"]["a2a-task"] == task.id
            assert 0 < seen["time_left"] <= 7  # the client's budget, not the default 30 s

            # SendStreamingMessage: in order, the notes as WORKING, ending at COMPLETED
            streaming = client_for(http, card, binding, streaming=True)
            events = [e async for e in streaming.send_message(SendMessageRequest(
                message=user_message({"q": "why"})))]
            kinds = [kind_of(e) for e in events]
            assert kinds == ["task:TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_WORKING",
                             "TASK_STATE_WORKING", "artifact", "TASK_STATE_COMPLETED"], kinds
            notes = [p.text for e in events if e.HasField("status_update")
                     for p in e.status_update.status.message.parts]
            assert notes == ["thinking", "almost"]
            assert MessageToDict(events[4].artifact_update.artifact.parts[0].data) == \
                {"answer": 42, "got": {"q": "why"}}
            streamed_id = events[0].task.id

            # GetTask, ListTasks (scoped to the agent: another agent's tenant sees none of them)
            got = await client.get_task(GetTaskRequest(id=streamed_id))
            assert got.status.state == TaskState.TASK_STATE_COMPLETED
            listed = await client.list_tasks(ListTasksRequest(include_artifacts=True))
            assert {task.id, streamed_id} <= {t.id for t in listed.tasks}
            other_card = await A2ACardResolver(http, info["url"] + "/agents/other").get_agent_card()
            other_client = client_for(http, other_card, binding, streaming=False)
            assert not (await other_client.list_tasks(ListTasksRequest())).tasks
            with pytest.raises(A2AError):
                await other_client.get_task(GetTaskRequest(id=streamed_id))

            # CancelTask on a finished task: not cancelable
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=task.id))

            # CancelTask on a running one: the mesh request is cancelled (the handler sees it)
            stream = streaming.send_message(SendMessageRequest(message=user_message("x", topic="slow")))
            running_id = ""
            async for event in stream:
                if kind_of(event) == "TASK_STATE_WORKING":
                    running_id = event.status_update.task_id
                    break
            await asyncio.wait_for(seen["started"].wait(), 10)
            # SubscribeToTask from a second client: the task as it is, then its end
            watcher = client_for(http, card, binding, streaming=True)
            watched: list[str] = []
            subscribed = asyncio.Event()

            async def watch() -> None:
                async for event in watcher.subscribe(SubscribeToTaskRequest(id=running_id)):
                    watched.append(kind_of(event))
                    subscribed.set()

            watching = asyncio.ensure_future(watch())
            await asyncio.wait_for(subscribed.wait(), 10)
            cancelled = await client.cancel_task(CancelTaskRequest(id=running_id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            await asyncio.wait_for(seen["cancelled"].wait(), 10)
            await asyncio.wait_for(watching, 10)  # the subscription ends at the terminal state
            assert watched[0] == "task:TASK_STATE_WORKING" and watched[-1] == "TASK_STATE_CANCELED", watched
            await stream.aclose()
            final = await client.get_task(GetTaskRequest(id=running_id))
            assert final.status.state == TaskState.TASK_STATE_CANCELED

    with meshd_a2a(a, tmp_path) as info:
        asyncio.run(scenario(info))


def test_a2a_the_hosts_own_agent_and_a2a_0_3_clients(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """``a2a.default_agent``: its card at the host's root names no tenant, and calls without one
    (single-agent clients, A2A 0.3 clients through the SDK's adapters) reach it."""
    a = meshd_factory.spawn("a")

    async def scenario(info: dict[str, Any]) -> None:
        async with Agent("expert", socket=a.socket) as expert, a2a_http(info) as http:
            expert_handlers(expert, {})
            await served(http, info, "expert")
            card = await A2ACardResolver(http, info["url"]).get_agent_card()
            assert card.name == "expert" and not any(i.tenant for i in card.supported_interfaces)
            for binding in BINDINGS:
                [event] = [e async for e in client_for(http, card, binding, streaming=False).send_message(
                    SendMessageRequest(message=user_message("root")))]
                assert artifact_data(event.task) == {"answer": 42, "got": "root"}
            # an A2A 0.3 client: 0.3 method names and shapes, no A2A-Version header (a client of
            # its own: the SDK's 1.0 client set that header on the shared one)
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {info['token']}"}) as plain:
                old = await plain.post(info["url"] + "/a2a/jsonrpc", json={
                    "jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {"message": {
                        "role": "user", "messageId": "m-old", "kind": "message",
                        "parts": [{"kind": "text", "text": "old"}]}}})
            result = old.json()["result"]
            assert result["kind"] == "task" and result["status"]["state"] == "completed", result
            assert result["artifacts"][0]["parts"][0]["data"] == {"answer": 42, "got": "old"}

    with meshd_a2a(a, tmp_path, '[a2a]\ndefault_agent = "expert"\n') as info:
        asyncio.run(scenario(info))


def test_a2a_messages_to_the_tasks_agent_become_meshd_tasks(meshd_factory: MeshdFactory,
                                                          tmp_path: Path) -> None:
    """``a2a.tasks_agent``: a message naming a capability is a meshd task (create_task) for the
    least-loaded agent with it, on another daemon; its result is the artifact; an A2A cancel
    cancels the meshd task."""
    from meshd.tasks.worker import TaskWorker

    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    started = asyncio.Event()

    async def handle(task: Any) -> Any:
        if task.title == "hang":
            started.set()
            await asyncio.sleep(60)
        return sum(task.input)

    async def scenario(info: dict[str, Any]) -> None:
        async with Agent("adder", socket=b.socket, capabilities=["sum"]) as adder, \
                Agent("owner", socket=a.socket) as owner, a2a_http(info) as http:
            TaskWorker(adder, handle)
            catalog = await served(http, info, "meshd-tasks", "adder")
            tasks_entry = next(x for x in catalog["agents"] if x["name"] == "meshd-tasks")
            assert "sum" in tasks_entry["skills"]
            card = await A2ACardResolver(http, info["url"] + "/agents/meshd-tasks").get_agent_card()
            for binding in BINDINGS:
                streaming = client_for(http, card, binding, streaming=True)
                events = [e async for e in streaming.send_message(SendMessageRequest(
                    message=user_message([1, 2, 3], capability="sum", title="add"),
                    metadata={"timeout_s": 20}))]
                assert kind_of(events[-1]) == "TASK_STATE_COMPLETED", [kind_of(e) for e in events]
                notes = [p.text for e in events if e.HasField("status_update")
                         for p in e.status_update.status.message.parts]
                assert notes and notes[0].startswith("meshd task ")
                done = next(e for e in events if e.HasField("artifact_update"))
                assert MessageToDict(done.artifact_update.artifact.parts[0].data) == 6

                # a plan: tasks with deps, across agents; the reply holds each task's result
                [planned] = [e async for e in client_for(http, card, binding, streaming=False).send_message(
                    SendMessageRequest(message=user_message({"tasks": [
                        {"id": "first", "title": "add", "capability": "sum", "input": [1, 1]},
                        {"id": "second", "title": "add", "capability": "sum", "input": [2, 2],
                         "deps": ["first"]}]}, plan=True), metadata={"timeout_s": 30}))]
                assert planned.task.status.state == TaskState.TASK_STATE_COMPLETED, planned.task.status
                reply = artifact_data(planned.task)
                assert reply["results"] == {"first": 2, "second": 4} and reply["state"] == "done"

                [missing] = [e async for e in client_for(http, card, binding, streaming=False).send_message(
                    SendMessageRequest(message=user_message([1])))]
                assert missing.task.status.state == TaskState.TASK_STATE_REJECTED
                assert error_data(missing.task.status)["code"] == "VALIDATION_FAILED"

                started.clear()
                stream = streaming.send_message(SendMessageRequest(message=user_message(
                    [0], capability="sum", title="hang")))
                meshd_id = ""
                async for event in stream:
                    update = event.status_update if event.HasField("status_update") else None
                    for part in update.status.message.parts if update is not None else []:
                        meshd_id = meshd_id or part.text.split()[2].rstrip(":")
                    if meshd_id:
                        break
                await asyncio.wait_for(started.wait(), 20)
                cancelled = await streaming.cancel_task(CancelTaskRequest(id=event.status_update.task_id))
                assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
                await stream.aclose()
                record = await owner.call_tool("wait_task", {"task_id": meshd_id, "timeout_s": 10},
                                               timeout=15)
                assert record["state"] == "cancelled", record

    with meshd_a2a(a, tmp_path) as info:
        asyncio.run(scenario(info))


def test_a2a_errors_map_to_task_states(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """The table of docs/a2a.md, "Errors", end to end: each meshd failure ends the task in its
    state, with the code in the status message's data part."""
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario(info: dict[str, Any]) -> None:
        async with Agent("expert", socket=b.socket) as expert, Agent("hidden", socket=b.socket), \
                a2a_http(info) as http:
            expert_handlers(expert, {})
            catalog = await served(http, info, "expert")
            assert "hidden" not in {x["name"] for x in catalog["agents"]}  # a2a.expose
            hidden = await http.get(info["url"] + "/agents/hidden/.well-known/agent-card.json")
            assert hidden.status_code == 404 and hidden.json()["error"] == "NO_SUCH_AGENT"
            card = await A2ACardResolver(http, info["url"] + "/agents/expert").get_agent_card()
            for binding in BINDINGS:
                client = client_for(http, card, binding, streaming=False)

                async def outcome(msg: Message, client: Any = client, **meta: Any) -> Any:
                    [event] = [e async for e in client.send_message(SendMessageRequest(
                        message=msg, metadata=meta or None))]
                    return event.task.status

                status = await outcome(user_message("x", topic="boom"))
                assert status.state == TaskState.TASK_STATE_FAILED
                assert error_data(status)["code"] == "HANDLER_ERROR"
                assert "the handler broke" in error_data(status)["message"]

                status = await outcome(user_message("x", topic="slow"), timeout_s=0.5)
                assert status.state == TaskState.TASK_STATE_FAILED
                assert error_data(status)["code"] == "TIMEOUT"

                # an agent that is not served (a2a.expose) and one that does not exist, by tenant
                for tenant, state, code in (("hidden", "TASK_STATE_REJECTED", "FORBIDDEN"),
                                            ("ghost", "TASK_STATE_REJECTED", "NO_SUCH_AGENT")):
                    forged = AgentCard()
                    forged.CopyFrom(card)
                    for interface in forged.supported_interfaces:
                        interface.tenant = tenant
                    forged_client = client_for(http, forged, binding, streaming=False)
                    status = await outcome(user_message("x"), forged_client)
                    assert TaskState.Name(status.state) == state, (tenant, status)
                    assert error_data(status)["code"] == code, tenant

    with meshd_a2a(a, tmp_path, 'name = "a"\n[a2a]\nexpose = ["expert", "ghost"]\n') as info:
        asyncio.run(scenario(info))


def test_a2a_through_the_tools_a_held_call_is_auth_required(meshd_factory: MeshdFactory,
                                                           tmp_path: Path) -> None:
    """With ``a2a.through_tools``, the daemon's approval policy applies to A2A callers: a call
    held for a person is AUTH_REQUIRED (with the approval id) until allowed, then COMPLETED;
    a denied one ends REJECTED with APPROVAL_DENIED."""
    conf = tmp_path / "meshd.toml"
    conf.write_text('[tools]\napproval = { request_agent = "hold" }\n')
    a = meshd_factory.spawn("a", "--config", str(conf))

    async def decide(person: Agent, note: str, op: str) -> None:
        approval = note.split()[3].rstrip(":")  # "held for approval ID: meshctl approvals ..."
        sys_agent = system_agent_name(str(person.node))
        assert (await person.request(sys_agent, TOPIC_APPROVALS, {"op": op, "id": approval},
                                     timeout=10))

    async def scenario(info: dict[str, Any]) -> None:
        async with Agent("expert", socket=a.socket) as expert, Agent("person", socket=a.socket) as person, \
                a2a_http(info) as http:
            expert_handlers(expert, {})
            await served(http, info, "expert")
            card = await A2ACardResolver(http, info["url"] + "/agents/expert").get_agent_card()
            for binding in BINDINGS:
                streaming = client_for(http, card, binding, streaming=True)
                for op, last in (("allow", "TASK_STATE_COMPLETED"), ("deny", "TASK_STATE_REJECTED")):
                    kinds: list[str] = []
                    async for event in streaming.send_message(SendMessageRequest(message=user_message("q"))):
                        kinds.append(kind_of(event))
                        if kinds[-1] == "TASK_STATE_AUTH_REQUIRED":
                            held = event.status_update
                            break
                    assert kinds[-1] == "TASK_STATE_AUTH_REQUIRED", kinds
                    # a subscriber sees the task waiting, then (decided by a person) its end
                    watch = streaming.subscribe(SubscribeToTaskRequest(id=held.task_id))
                    assert kind_of(await anext(watch)) == "task:TASK_STATE_AUTH_REQUIRED"
                    await decide(person, held.status.message.parts[0].text, op)
                    ended = [kind_of(e) async for e in watch]
                    assert ended[-1] == last, ended
                    task_id = held.task_id
                    final = await streaming.get_task(GetTaskRequest(id=task_id))
                    if op == "allow":
                        assert artifact_data(final) == {"answer": 42, "got": "q"}
                    else:
                        assert error_data(final.status)["code"] == "APPROVAL_DENIED"

    with meshd_a2a(a, tmp_path, "[a2a]\nthrough_tools = true\n") as info:
        asyncio.run(scenario(info))


def test_a2a_task_store_is_bounded(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    seen: dict[str, Any] = {}

    async def scenario(info: dict[str, Any]) -> None:
        async with Agent("expert", socket=a.socket) as expert, a2a_http(info) as http:
            expert_handlers(expert, seen)
            await served(http, info, "expert")
            card = await A2ACardResolver(http, info["url"] + "/agents/expert").get_agent_card()
            for binding in BINDINGS:
                client = client_for(http, card, binding, streaming=False)
                running = []
                for _ in range(2):  # two running tasks fill a store of 2
                    [event] = [e async for e in client.send_message(SendMessageRequest(
                        message=user_message("x", topic="slow"),
                        configuration=SendMessageConfiguration(return_immediately=True)))]
                    running.append(event.task.id)
                with pytest.raises(A2AError, match="TASK_STORE_FULL"):
                    [e async for e in client.send_message(SendMessageRequest(message=user_message("y")))]
                for task_id in running:
                    await client.cancel_task(CancelTaskRequest(id=task_id))
                # finished tasks make room: the oldest is forgotten
                [event] = [e async for e in client.send_message(SendMessageRequest(message=user_message()))]
                assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
                with pytest.raises(A2AError):
                    await client.get_task(GetTaskRequest(id=running[0]))
                for task_id in running[1:]:  # clear the store for the next binding
                    with contextlib.suppress(A2AError):
                        await client.cancel_task(CancelTaskRequest(id=task_id))
                # fill again with finished ones: they are evicted, never refused (and counted)
                for _ in range(3):
                    [event] = [e async for e in client.send_message(
                        SendMessageRequest(message=user_message()))]
                    assert event.task.status.state == TaskState.TASK_STATE_COMPLETED
            stats = await asyncio.to_thread(meshctl, a, "a2a", "stats")
            assert stats["tasks_refused"] == 2 and stats["tasks_max"] == 2 and stats["tasks_evicted"] >= 6

    with meshd_a2a(a, tmp_path, "[a2a]\nmax_tasks = 2\n") as info:
        asyncio.run(scenario(info))


def test_a2a_hostile_http_input_is_refused_at_the_edge(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")

    async def scenario(info: dict[str, Any]) -> None:
        rpc = info["url"] + "/a2a/jsonrpc"
        async with Agent("expert", socket=a.socket) as expert, a2a_http(info) as http:
            expert_handlers(expert, {})
            await served(http, info, "expert")
            big = await http.post(rpc, content=b"x" * 5000, headers={"content-type": "application/json"})
            assert big.status_code == 413 and big.json()["error"] == "TOO_LARGE"

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield b"y" * 1000

            chunked = await http.post(rpc, content=chunks(), headers={"content-type": "application/json"})
            assert chunked.status_code == 413
            foreign = await http.get(info["catalog"], headers={"host": "evil.example:80"})
            assert foreign.status_code == 421
            garbage = await http.post(rpc, content=b"{not json", headers={"content-type": "application/json"})
            assert garbage.json()["error"]["code"] == -32700
            unknown = await http.post(rpc, json={"jsonrpc": "2.0", "id": 1, "method": "NoSuchMethod",
                                                 "params": {}})
            assert unknown.json()["error"]["code"] == -32601
            wrong = await http.post(rpc, json={"jsonrpc": "2.0", "id": 2, "method": "SendMessage",
                                               "params": {"message": {"parts": "not a list"}}})
            assert wrong.json()["error"]["code"] in (-32600, -32602)
            # connections beyond a2a.max_connections are answered 503 (idle ones count)
            host, port = info["url"].removeprefix("http://").split(":")
            idle = [socket.create_connection((host, int(port))) for _ in range(4)]
            try:
                statuses = []
                for _ in range(100):  # until the server has taken the idle connections in
                    async with httpx.AsyncClient() as fresh:
                        statuses.append((await fresh.get(info["catalog"])).status_code)
                    if statuses[-1] == 503:
                        break
                    await asyncio.sleep(0.02)
                assert statuses[-1] == 503, statuses
            finally:
                for sock in idle:
                    sock.close()
            for _ in range(100):  # until the server has seen them close
                if (await http.get(info["catalog"])).status_code == 200:
                    break
                await asyncio.sleep(0.02)
            # every refusal is counted (meshctl a2a stats)
            stats = await asyncio.to_thread(meshctl, a, "a2a", "stats")
            assert stats["http_refused"]["TOO_LARGE"] == 2 and stats["http_refused"]["MISDIRECTED"] == 1
            # and it still serves
            card = await A2ACardResolver(http, info["url"] + "/agents/expert").get_agent_card()
            [event] = [e async for e in client_for(http, card, "JSONRPC", streaming=False).send_message(
                SendMessageRequest(message=user_message("ok")))]
            assert event.task.status.state == TaskState.TASK_STATE_COMPLETED

    with meshd_a2a(a, tmp_path, "[a2a]\nmax_body_bytes = 4096\nmax_connections = 4\n") as info:
        asyncio.run(scenario(info))


def test_a2a_bad_options_are_one_line_errors(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    cfg = tmp_path / "bad.toml"
    for config, flags, says in (
            ("", ["--listen", "10.1.2.3:8768"], "plain HTTP on 10.1.2.3"),
            ("[a2a]\nmax_tasks = 0\n", [], "a2a.max_tasks"),
            ('[a2a]\n[[a2a.remote_agents]]\nurl = "http://203.0.113.9/.well-known/agent-card.json"\n', [],
             "not in a2a.trusted_hosts")):
        cfg.write_text(config)
        r = subprocess.run([sys.executable, "-m", "meshd", "a2a", "--socket", str(a.socket), "--config",
                            str(cfg), *flags], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stderr
        assert says in r.stderr and "Traceback" not in r.stderr, r.stderr


# ----------------------------------------------------------------- external A2A agents in the mesh


class WeatherExecutor(AgentExecutor):
    """An A2A agent written with the SDK's server only: streams notes, asks for input, waits."""

    def __init__(self) -> None:
        # threading events: the server runs on a thread of its own, the test waits on its loop
        self.cancelled = threading.Event()
        self.started = threading.Event()
        self.topics: list[str] = []
        self.texts: queue.Queue[str] = queue.Queue()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
        updater = TaskUpdater(event_queue, context.task_id or "", context.context_id or "")
        text = context.get_user_input()
        self.topics.append(str(dict(context.message.metadata).get("topic")))
        self.texts.put(text)
        await updater.start_work(updater.new_agent_message([Part(text="looking at the sky")]))
        if text == "wait":
            self.started.set()
            await asyncio.sleep(60)
        if text == "where?":
            await updater.requires_input(updater.new_agent_message([Part(text="which city?")]))
            return
        await updater.update_status(TaskState.TASK_STATE_WORKING,
                                    updater.new_agent_message([Part(text="measuring")]))
        await updater.add_artifact([Part(text=f"sunny in {text}")], name="forecast")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        self.cancelled.set()
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()


@contextlib.contextmanager
def sdk_server(executor: AgentExecutor, port: int = 0) -> Iterator[str]:
    """An A2A agent on the SDK's own server (JSON-RPC and HTTP+JSON) on a loopback port (0: any
    free one), on a thread of its own (``meshd a2a`` reads its card while the test waits); yields
    its card URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # asyncio: TCP_NODELAY
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    card = AgentCard(
        name="Weather Bot", description="forecasts", version="1.0",
        supported_interfaces=[
            AgentInterface(url=base + "/rpc", protocol_binding="JSONRPC", protocol_version="1.0"),
            AgentInterface(url=base, protocol_binding="HTTP+JSON", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True), default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="forecast", name="forecast", description="the weather", tags=["weather"])])
    handler = DefaultRequestHandler(agent_executor=executor, task_store=InMemoryTaskStore(), agent_card=card)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, rpc_url="/rpc"),
                            *create_rest_routes(handler)])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, what="the SDK's server")
        yield base + "/.well-known/agent-card.json"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def test_external_a2a_agent_is_called_from_the_mesh(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    executor = WeatherExecutor()

    async def scenario() -> None:
        async with Agent("planner", socket=a.socket) as planner:
            await wait_listed(planner, "Weather-Bot")
            record = next(r for r in await planner.agents() if r["name"] == "Weather-Bot")
            assert record["capabilities"] == ["forecast"] and record["node_name"] == "b"

            # streaming: the remote's WORKING notes arrive as progress, the artifact as the reply
            notes: list[str] = []
            reply = await planner.request("Weather-Bot", "weather.ask", "Oslo", timeout=20,
                                          on_progress=notes.append)
            assert reply == "sunny in Oslo"
            assert notes == ["looking at the sky", "measuring"]
            assert executor.topics[-1] == "weather.ask"

            # INPUT_REQUIRED: a typed answer to continue from (the task id in a header)
            asked = await planner.request("Weather-Bot", "weather.ask", "where?", timeout=20)
            assert asked["state"] == "input-required" and asked["text"] == "which city?"
            follow = await planner.request("Weather-Bot", "weather.ask", "Bergen", timeout=20,
                                           headers={"a2a-task": asked["task_id"],
                                                    "a2a-context": asked["context_id"]})
            assert follow == "sunny in Bergen"

            # a mesh send (no answer wanted) is a SendMessage too
            await planner.send("Weather-Bot", "weather.tell", "Paris")
            told = [await asyncio.to_thread(executor.texts.get, True, 10) for _ in range(4)]
            assert told[-1] == "Paris", told

            # a mesh cancel becomes CancelTask
            call = asyncio.ensure_future(planner.request("Weather-Bot", "weather.ask", "wait", timeout=30))
            assert await asyncio.to_thread(executor.started.wait, 10)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            assert await asyncio.to_thread(executor.cancelled.wait, 10)

    with sdk_server(executor) as card_url:
        port = card_url.split(":")[2].split("/")[0]
        config = (f'[a2a]\ntrusted_hosts = ["127.0.0.1:{port}"]\n'
                  f'[[a2a.remote_agents]]\nurl = "{card_url}"\n')
        with meshd_a2a(b, tmp_path, config) as info:
            assert info["remote_agents"] == {"Weather-Bot": card_url}
            asyncio.run(scenario())


# --------------------------------------------------------------------------------- the LAN


def meshctl(proc: MeshdProcess, *args: str) -> Any:
    r = subprocess.run([sys.executable, "-c", "from meshd.cli.main import meshctl_main; "
                        "raise SystemExit(meshctl_main())", "--socket", str(proc.socket), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_a2a_agents_on_the_lan_join_only_once_trusted(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """DNS-SD ``_a2a._tcp`` on 127.0.0.1: meshd a2a advertises its served agents' cards, and an
    A2A agent another host advertises is listed discovered-but-not-admitted until an operator
    trusts it (``meshctl a2a trust NAME``); then it is a mesh agent like a configured one."""
    from zeroconf import IPVersion
    from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    executor = WeatherExecutor()
    service = "_a2a._tcp.local."

    async def scenario(info: dict[str, Any], card_url: str) -> None:
        zc = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
        try:
            port = int(card_url.split(":")[2].split("/")[0])
            label = f"weather-{uuid.uuid4().hex[:6]}"
            foreign = AsyncServiceInfo(service, f"{label}.{service}", port=port, addresses=[socket.inet_aton(
                "127.0.0.1")], properties={"url": card_url, "name": "Weather Bot", "proto": "1.0"},
                server=f"{label}.local.")
            await (await zc.async_register_service(foreign))
            async with Agent("expert", socket=a.socket) as expert, Agent("outsider", socket=b.socket) as out:
                expert_handlers(expert, {})
                # ours: meshd a2a advertises the served agent with its card's URL
                found: dict[str, AsyncServiceInfo] = {}
                listed = asyncio.Event()

                def on_change(zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
                    found.setdefault(name, AsyncServiceInfo(service_type, name))
                    listed.set()

                browser = AsyncServiceBrowser(zc.zeroconf, service, handlers=[on_change])
                want = info["url"] + "/agents/expert/.well-known/agent-card.json"
                for _ in range(100):
                    for record in list(found.values()):
                        await record.async_request(zc.zeroconf, 1000)
                    urls = {(r.properties or {}).get(b"url") for r in found.values()}
                    if want.encode() in urls:
                        break
                    await asyncio.sleep(0.1)
                assert want.encode() in urls, urls
                await browser.async_cancel()
                async with httpx.AsyncClient() as http:  # and an A2A client resolves it from there
                    assert (await A2ACardResolver(http, want.removesuffix(
                        "/.well-known/agent-card.json")).get_agent_card()).name == "expert"

                # theirs: discovered, not admitted, not in the mesh
                discovered: list[dict[str, Any]] = []
                for _ in range(100):
                    discovered = await asyncio.to_thread(meshctl, a, "a2a", "list", "--json")
                    if any(d["name"] == label for d in discovered):
                        break
                    await asyncio.sleep(0.1)
                item = next(d for d in discovered if d["name"] == label)
                assert item["url"] == card_url and not item["admitted"]
                assert "Weather-Bot" not in {r["name"] for r in await expert.agents()}
                # an agent of another node may not admit it
                with pytest.raises(Forbidden):
                    await out.request(info["agent"], "meshd.a2a.lan", {"op": "trust", "name": label},
                                      timeout=10)

                admitted = await asyncio.to_thread(meshctl, a, "a2a", "trust", label)
                assert admitted["admitted"] and admitted["mesh_name"] == "Weather-Bot"
                await wait_listed(out, "Weather-Bot")
                assert await out.request("Weather-Bot", "weather", "Oslo", timeout=20) == "sunny in Oslo"
        finally:
            await zc.async_close()

    # the admissions are remembered in the (daemon's) state dir: after a restart it joins again
    state = tmp_path / "a2a-state"
    config = f'state_dir = "{state}"\n[a2a]\nlan_discovery = true\nexpose = ["expert"]\n'

    async def rejoined() -> None:
        async with Agent("outsider", socket=b.socket) as out:
            await wait_listed(out, "Weather-Bot")
            assert await out.request("Weather-Bot", "weather", "Bergen", timeout=20) == "sunny in Bergen"

    with sdk_server(executor) as card_url:
        with meshd_a2a(a, tmp_path, config) as info:
            asyncio.run(scenario(info, card_url))
        remembered = state / "a2a-a2a-admitted.json"
        assert remembered.stat().st_mode & 0o777 == 0o600
        assert list(json.loads(remembered.read_text()).values()) == [card_url]
        with meshd_a2a(a, tmp_path, config):
            asyncio.run(rejoined())
            listed = meshctl(a, "a2a", "list", "--json")
            assert [(d["url"], d["admitted"]) for d in listed if d["url"] == card_url] == [(card_url, True)]


def test_a2a_without_the_extra_is_a_one_line_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a2a.py"
    blocker.write_text("raise ImportError('a2a hidden by the test')\n")
    r = subprocess.run([sys.executable, "-m", "meshd", "a2a", "--socket", str(tmp_path / "none.sock")],
                       capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "meshd: meshd a2a needs the 'a2a' extra: pip install 'meshd-daemon[a2a]'"]


def test_an_external_agent_down_at_start_joins_later_and_its_failures_are_typed(
        meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # a port nobody listens on yet
    card_url = f"http://127.0.0.1:{port}/.well-known/agent-card.json"
    config = f'[a2a]\ntrusted_hosts = ["127.0.0.1:{port}"]\n[[a2a.remote_agents]]\nurl = "{card_url}"\n'

    async def call(planner: Agent, *args: Any, **kwargs: Any) -> Any:
        return await planner.request("Weather-Bot", "weather", *args, timeout=20, **kwargs)

    with meshd_a2a(a, tmp_path, config) as info:
        assert info["remote_agents"] == {} and info["remote_agents_waiting"] == [card_url]

        async def joins() -> None:
            async with Agent("planner", socket=a.socket) as planner:
                await wait_listed(planner, "Weather-Bot", timeout=60)
                assert await call(planner, "Oslo") == "sunny in Oslo"
                with pytest.raises(ValidationFailed, match="not found"):  # a task it does not know
                    await call(planner, "x", headers={"a2a-task": "no-such-task"})

        with sdk_server(WeatherExecutor(), port):
            asyncio.run(joins())

        async def gone() -> None:  # the server stopped: the mesh agent stays, its calls fail typed
            async with Agent("planner", socket=a.socket) as planner:
                with pytest.raises(PeerUnreachable):
                    await call(planner, "Oslo")

        asyncio.run(gone())


def test_a_signed_card_is_trusted_from_any_host(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """Two meshes: mesh one's ``meshd a2a`` signs its cards (``a2a.signing_key``); mesh two's
    trusts cards signed by that key (``a2a.card_keys``) with no trusted host, and its agents reach
    mesh one's agent through A2A. A card signed by another key is not trusted."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    def keypair(name: str) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        private, public = tmp_path / f"{name}.key", tmp_path / f"{name}.pub"
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                              serialization.NoEncryption()))
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))
        return private, public

    signing, trusted_pub = keypair("one")
    _, other_pub = keypair("other")
    one = meshd_factory.spawn("one")
    two = meshd_factory.spawn("two", mesh=meshd_factory.mesh + "b")

    async def call_through(info_two: dict[str, Any]) -> None:
        async with Agent("asker", socket=two.socket) as asker:
            await wait_listed(asker, "expert", timeout=40)  # a background join retries after 1, 2, 4... s
            assert await asker.request("expert", "a2a.message", "via A2A", timeout=20) == \
                {"answer": 42, "got": "via A2A"}

    with meshd_a2a(one, tmp_path, f'[a2a]\nsigning_key = "{signing}"\nsigning_key_id = "one"\n',
                   name="one") as info_one:
        card_url = info_one["url"] + "/agents/expert/.well-known/agent-card.json"

        async def check_signed() -> None:
            async with Agent("expert", socket=one.socket) as expert, a2a_http(info_one) as http:
                expert_handlers(expert, {})
                await served(http, info_one, "expert")
                card = await A2ACardResolver(http, card_url.removesuffix("/.well-known/agent-card.json")
                                             ).get_agent_card()
                assert len(card.signatures) == 1
                for key_file, config_name, joins in ((trusted_pub, "two", True), (other_pub, "three", False)):
                    config = (f'[a2a]\ncard_keys = ["{key_file}"]\n'
                              f'[[a2a.remote_agents]]\nurl = "{card_url}"\n'
                              f'token_file = "{info_one["token_file"]}"\n')
                    with meshd_a2a(two, tmp_path, config, name=config_name) as info_two:
                        if joins:  # at once, or in the background when it took longer to start
                            assert info_two["remote_agents"] in ({"expert": card_url}, {}), info_two
                            assert info_two["remote_agents_waiting"] in ([], [card_url]), info_two
                            await call_through(info_two)
                        else:
                            assert info_two["remote_agents_waiting"] == [card_url]
                            assert "not signed by a key of a2a.card_keys" in info_two["log"].read_text()

        asyncio.run(check_signed())


def _tls_files(tmp: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    files: dict[str, Path] = {}

    def write(name: str, key: Any, cert: Any) -> None:
        files[name + ".key"] = tmp / f"{name}.key"
        files[name + ".pem"] = tmp / f"{name}.pem"
        files[name + ".key"].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
        files[name + ".pem"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(cn: str, key: Any, issuer: Any, signer: Any, *, ca: bool, san: Any = None) -> Any:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if san is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return builder.sign(signer, hashes.SHA256())

    import ipaddress

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    write("ca", ca_key, issue("test CA", ca_key, ca_name, ca_key, ca=True))
    server_key = ec.generate_private_key(ec.SECP256R1())
    write("server", server_key, issue("127.0.0.1", server_key, ca_name, ca_key, ca=False,
                                      san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]))
    client_key = ec.generate_private_key(ec.SECP256R1())
    write("client", client_key, issue("client", client_key, ca_name, ca_key, ca=False))
    return files


def test_a2a_over_tls_with_client_certificates(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    """``--tls-cert/--tls-key`` and ``--tls-client-ca``: https cards and endpoints, the cards
    declare the mtls scheme, and a client without a certificate the CA signed gets no connection."""
    import ssl

    tls = _tls_files(tmp_path)
    a = meshd_factory.spawn("a")
    url_file = a.socket.parent / "a2a-tls.json"
    (tmp_path / "tls.toml").write_text("")
    child = subprocess.Popen([sys.executable, "-m", "meshd", "a2a", "--socket", str(a.socket),
                              "--name", "tls", "--listen", "127.0.0.1:0",
                              "--config", str(tmp_path / "tls.toml"),
                              "--tls-cert", str(tls["server.pem"]), "--tls-key", str(tls["server.key"]),
                              "--tls-client-ca", str(tls["ca.pem"])], stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: url_file.exists() or child.poll() is not None, 30, what="a2a URL file")
        info = json.loads(url_file.read_text())
        token = Path(info["token_file"]).read_text().strip()
        assert info["url"].startswith("https://127.0.0.1:")

        async def scenario() -> None:
            trust = ssl.create_default_context(cafile=str(tls["ca.pem"]))
            with_cert = ssl.create_default_context(cafile=str(tls["ca.pem"]))
            with_cert.load_cert_chain(str(tls["client.pem"]), str(tls["client.key"]))
            async with Agent("expert", socket=a.socket) as expert, httpx.AsyncClient(
                    verify=with_cert, headers={"Authorization": f"Bearer {token}"}) as http:
                expert_handlers(expert, {})
                await served(http, info, "expert")
                card = await A2ACardResolver(http, info["url"] + "/agents/expert").get_agent_card()
                assert {"bearer", "mtls"} <= set(card.security_schemes)
                assert all(i.url.startswith("https://") for i in card.supported_interfaces)
                [event] = [e async for e in client_for(http, card, "JSONRPC", streaming=False).send_message(
                    SendMessageRequest(message=user_message("over TLS")))]
                assert artifact_data(event.task) == {"answer": 42, "got": "over TLS"}
                async with httpx.AsyncClient(verify=trust) as no_cert:
                    with pytest.raises(httpx.HTTPError):
                        await no_cert.get(info["catalog"])

        asyncio.run(scenario())
    finally:
        child.terminate()
        assert child.wait(20) == 0


def test_stopping_meshd_a2a_cancels_the_mesh_requests_it_runs(meshd_factory: MeshdFactory,
                                                              tmp_path: Path) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    seen: dict[str, Any] = {}

    async def scenario(info: dict[str, Any]) -> None:
        async with Agent("expert", socket=b.socket) as expert, a2a_http(info) as http:
            expert_handlers(expert, seen)
            await served(http, info, "expert")
            card = await A2ACardResolver(http, info["url"] + "/agents/expert").get_agent_card()
            [event] = [e async for e in client_for(http, card, "JSONRPC", streaming=False).send_message(
                SendMessageRequest(message=user_message("x", topic="slow"),
                                   configuration=SendMessageConfiguration(return_immediately=True)))]
            assert event.task.id
            await asyncio.wait_for(seen["started"].wait(), 10)
            os.kill(info["pid"], signal.SIGTERM)  # the meshd a2a this test started
            info["stopped"] = True
            await asyncio.wait_for(seen["cancelled"].wait(), 15)

    with meshd_a2a(a, tmp_path) as info:
        asyncio.run(scenario(info))
