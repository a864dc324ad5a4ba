"""The HTTP/SSE gateway on real daemons (127.0.0.1, real zeroconf): an HTTP agent is a mesh agent.

Auth on every endpoint, the token and URL files, LAN listen refused without TLS, every bad input,
and the round trips between an HTTP agent on one daemon and Python agents on another.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import stat
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from meshd import Agent, HopLimit
from meshd.gateway.openapi import ROUTES
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until, wait_listed


def gateway_of(proc: MeshdProcess) -> tuple[str, str]:
    gw = proc.gateway()
    return gw.url, gw.token


class Http:
    """A small HTTP client for one gateway (what any language's HTTP library does)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str) -> None:
        self.s = session
        self.url = url
        self.auth = {"Authorization": f"Bearer {token}"}

    async def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else json.dumps(body if body is not None else {}).encode()
        async with self.s.post(self.url + path, data=data, headers=self.auth) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None)

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.s.get(self.url + path, headers=self.auth) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None)

    async def register(self, name: str, **extra: Any) -> dict[str, Any]:
        status, body = await self.post("v1/agents/register", {"name": name, **extra})
        assert status == 200, body
        return dict(body)


@asynccontextmanager
async def client(proc: MeshdProcess) -> AsyncIterator[Http]:
    url, token = gateway_of(proc)
    async with aiohttp.ClientSession() as s:
        yield Http(s, url, token)


class SseReader:
    """Reads an SSE stream into a queue of (id, event, data); remembers the last id."""

    def __init__(self, http: Http, path: str, last_id: int | None = None) -> None:
        self.http = http
        self.path = path
        self.last_id = last_id or 0
        self.events: asyncio.Queue[tuple[int | None, str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None
        self.status = 0

    async def start(self) -> SseReader:
        opened = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(self._run(opened))
        await opened
        return self

    async def _run(self, opened: asyncio.Future[None]) -> None:
        headers = dict(self.http.auth)
        if self.last_id:
            headers["Last-Event-ID"] = str(self.last_id)
        async with self.http.s.get(self.http.url + self.path, headers=headers,
                                   timeout=aiohttp.ClientTimeout(total=None)) as r:
            self.status = r.status
            opened.set_result(None)
            if r.status != 200:
                return
            ev_id: int | None = None
            name, data = "message", ""
            async for raw in r.content:
                line = raw.decode().rstrip("\n")
                if line.startswith("id: "):
                    ev_id = int(line[4:])
                elif line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    data += line[6:]
                elif line == "":
                    if data:
                        if ev_id is not None:
                            self.last_id = ev_id
                        await self.events.put((ev_id, name, json.loads(data)))
                    ev_id, name, data = None, "message", ""

    async def next(self, name: str, timeout: float = 10.0) -> Any:
        """The next event called ``name`` (others are skipped)."""
        async def find() -> Any:
            while True:
                _id, ev, data = await self.events.get()
                if ev == name:
                    return data
        return await asyncio.wait_for(find(), timeout)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def beating(http: Http, sid: str, stop: asyncio.Event, **telemetry: Any) -> None:
    while not stop.is_set():
        status, _ = await http.post(f"v1/agents/{sid}/heartbeat", telemetry)
        assert status == 200
        await asyncio.sleep(0.2)


# --------------------------------------------------------------------------- files and auth


def test_files_and_auth_on_every_endpoint(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    url, token = gateway_of(a)
    for name in ("http.token", "http.json"):
        st = (a.socket.parent / name).stat()
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid(), name

    async def scenario() -> None:
        async with aiohttp.ClientSession() as s:
            for route in ROUTES:
                method, path = route.method, route.path
                if route.public:
                    continue
                concrete = path.replace("{session_id}", "x").replace("{msg_id}", "y").replace("{name}", "z")
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token},
                                {"Authorization": f"Bearer {token}x"}):
                    async with s.request(method.upper(), url + concrete, headers=headers, data=b"{}") as r:
                        assert r.status == 401, (method, path, headers)
                        assert await r.read() == b"", (method, path)
            async with s.get(url + "v1/agents", headers={"Authorization": f"Bearer {token}"}) as r:
                assert r.status == 200
            async with s.get(url) as r:  # the page holds no data and is the one public path
                assert r.status == 200 and "text/html" in r.headers["Content-Type"]
                assert "<script>" in await r.text()
            async with s.get(url + "v1/openapi.json", headers={"Authorization": f"Bearer {token}"}) as r:
                spec = await r.json()
            documented = {(r.method, r.path) for r in ROUTES}
            assert {(m, p) for p, ops in spec["paths"].items() for m in ops} == documented

    asyncio.run(scenario())
    assert token not in a.log()


def test_token_rotate_with_meshctl(meshd_factory: MeshdFactory) -> None:
    import sys

    a = meshd_factory.spawn("a")
    url, old = gateway_of(a)
    meshctl = [str(Path(sys.executable).parent / "meshctl"), "--socket", str(a.socket), "http"]
    out = subprocess.run([*meshctl, "url"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == url
    out = subprocess.run([*meshctl, "token", "rotate"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    new = (a.socket.parent / "http.token").read_text().strip()
    assert new != old and stat.S_IMODE((a.socket.parent / "http.token").stat().st_mode) == 0o600

    async def scenario() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "v1/agents", headers={"Authorization": f"Bearer {old}"}) as r:
                assert r.status == 401
            async with s.get(url + "v1/agents", headers={"Authorization": f"Bearer {new}"}) as r:
                assert r.status == 200

    asyncio.run(scenario())
    assert old not in a.log() and new not in a.log()


def test_lan_listen_refused_without_tls(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", wait=False, env={"MESHD_HTTP_HOST": "0.0.0.0"})
    assert a.proc is not None
    code = a.proc.wait(30)
    assert code == 2
    assert "plain HTTP on 0.0.0.0" in a.log() and "http_host" in a.log()
    assert not (a.socket.parent / "http.token").exists()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed to make a test certificate")
def test_tls_serves_https(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    a = meshd_factory.spawn("a", env={"MESHD_HTTP_TLS_CERT": str(cert), "MESHD_HTTP_TLS_KEY": str(key)})
    url, token = gateway_of(a)
    assert url.startswith("https://127.0.0.1:")
    ctx = ssl.create_default_context(cafile=str(cert))

    async def scenario() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "v1/node", headers={"Authorization": f"Bearer {token}"}, ssl=ctx) as r:
                assert r.status == 200 and (await r.json())["node"] == a.node_id
            with pytest.raises(aiohttp.ClientError):
                async with s.get(url.replace("https", "http") + "v1/node") as r:
                    await r.read()

    asyncio.run(scenario())


def test_no_http_flag(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", "--no-http")
    assert a.info()["node"]
    assert not (a.socket.parent / "http.json").exists()


# --------------------------------------------------------------------------- bad input


def test_bad_input_gets_clear_answers(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={"MESHD_HTTP_MAX_BODY_BYTES": "2048", "MESHD_HTTP_MAX_STREAMS": "2",
                                      "MESHD_HTTP_MAX_SESSIONS": "2"})

    async def scenario() -> None:
        async with client(a) as http:
            status, body = await http.post("v1/agents/register", raw=b'{"name": "x",')
            assert status == 400 and body["error"]["code"] == "BAD_REQUEST"
            assert "malformed JSON" in body["error"]["message"]
            status, body = await http.post("v1/agents/register", raw=b"[1, 2]")
            assert status == 400 and "JSON object" in body["error"]["message"]
            status, body = await http.post("v1/agents/register", {"name": "has space"})
            assert status == 400 and body["error"]["code"] == "VALIDATION_FAILED"
            status, body = await http.post("v1/agents/register", {"name": "big", "model": "x" * 4000})
            assert status == 413 and body["error"]["code"] == "TOO_LARGE"
            status, body = await http.post("v1/agents/nosuch/heartbeat", {"context_used_pct": 3})
            assert status == 404 and body["error"]["code"] == "NO_SUCH_AGENT"
            status, body = await http.get("v1/agents/nosuch/events")
            assert status == 404 and body["error"]["code"] == "NO_SUCH_AGENT"
            me = await http.register("bad-input-1")
            sid = me["session_id"]
            status, body = await http.post("v1/messages", {"sender_session": sid, "target": "ghost",
                                                           "prompt": "hi"})
            assert status == 404 and body["error"]["code"] == "NO_SUCH_AGENT"
            status, body = await http.post("v1/messages", {"sender_session": sid, "target": "bad-input-1"})
            assert status == 400 and "prompt" in body["error"]["message"]
            status, body = await http.post(f"v1/agents/{sid}/heartbeat", {"context_used_pct": 120})
            assert status == 400 and "context_used_pct" in body["error"]["message"]
            status, body = await http.post("v1/messages/nope/response", {"response": "x"})
            assert status == 404 and body["error"]["code"] == "NO_SUCH_REQUEST"
            status, body = await http.post("v1/publish", {"session_id": sid, "topic": ""})
            assert status == 400
            status, body = await http.post("v1/agents/register", {"name": "bad-input-1"})
            assert status == 409 and body["error"]["code"] == "NAME_TAKEN"  # and nothing kept:
            await http.register("bad-input-2")
            status, body = await http.post("v1/agents/register", {"name": "bad-input-3"})
            assert status == 429 and body["error"]["code"] == "TOO_MANY_SESSIONS"
            status, body = await http.post("v1/agents/register",
                                           {"name": "bad-input-2", "session_id": "other"})
            assert status == 429  # the table is full before the name is even tried
            # streams: two allowed, the third is refused
            r1 = await SseReader(http, f"v1/agents/{sid}/events").start()
            r2 = await SseReader(http, "v1/dashboard/events").start()
            assert r1.status == r2.status == 200
            r3 = await SseReader(http, f"v1/agents/{sid}/events").start()
            assert r3.status == 429
            await r1.stop()
            await r2.stop()
            headers = dict(http.auth, **{"Last-Event-ID": "abc"})
            async def third_again() -> bool:
                async with http.s.get(http.url + f"v1/agents/{sid}/events", headers=headers) as r:
                    return r.status == 400  # a slot is free again; the bad header is the answer now
            await async_wait_until(third_again, 10, interval=0.1, what="a stream slot to free up")
            # the daemon is undisturbed
            status, body = await http.get("v1/node")
            assert status == 200 and body["gateway"]["auth_refused"] == 0

    asyncio.run(scenario())
    assert a.alive()


# --------------------------------------------------------------------------- the dashboard's outcomes


def test_dashboard_outcomes_while_a_dashboard_is_open(meshd_factory: MeshdFactory) -> None:
    """The dashboard's observer is registered while a stream is open and unregistered after:
    a second dashboard, opened later, gets outcomes again."""
    a = meshd_factory.spawn("a")

    async def outcome_seen(reader: SseReader, topic: str) -> None:
        while True:
            snap = await reader.next("snapshot")
            if any(o.get("topic") == topic and o.get("kind") == "request" for o in snap["outcomes"]):
                return

    async def scenario() -> None:
        async with client(a) as http, Agent("asker", socket=a.socket) as asker, \
                Agent("answerer", socket=a.socket) as answerer:
            answerer.on("*")(lambda msg: msg.topic)
            await wait_listed(asker, "answerer")
            for topic in ("first-look", "second-look"):
                reader = await SseReader(http, "v1/dashboard/events").start()
                await reader.next("snapshot")  # open: the observer is registered
                assert await asker.request("answerer", topic, None) == topic
                await asyncio.wait_for(outcome_seen(reader, topic), 15)
                await reader.stop()

                async def closed() -> bool:
                    return (await http.get("v1/node"))[1]["gateway"]["streams"] == 0
                await async_wait_until(closed, 10, what="the dashboard stream to close")

    asyncio.run(scenario())


# --------------------------------------------------------------------------- syscall tools over HTTP


def test_tools_listed_and_called_as_the_http_agent(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    conf = tmp_path / "meshd.toml"
    conf.write_text('[tools]\ncalls_per_minute = 6\napproval = {send_message = "deny"}\n')
    a = meshd_factory.spawn("a", "--config", str(conf))

    async def scenario() -> None:
        async with client(a) as http, Agent("answerer", socket=a.socket) as py:
            @py.on("question")
            async def answer(msg: Any) -> Any:
                return {"answer": 4, "via_system_agent": msg.sender.startswith("meshd.sys.")}

            sid = (await http.register("tool-http"))["session_id"]
            # 1. list (plain and in an LLM API's shape); a bad format or no session is a 400
            status, body = await http.get(f"v1/tools?session_id={sid}")
            assert status == 200, body
            tools = {t["name"]: t for t in body["tools"]}
            assert {"ask_agent", "list_agents", "send_message"} <= set(tools)
            assert tools["ask_agent"]["input_schema"]["required"] == ["agent", "question"]
            status, body = await http.get(f"v1/tools?session_id={sid}&format=openai")
            assert status == 200 and body["tools"][0]["type"] == "function"
            status, body = await http.get(f"v1/tools?session_id={sid}&format=mcp")
            assert status == 200 and all("inputSchema" in t for t in body["tools"])
            status, body = await http.get(f"v1/tools?session_id={sid}&format=yaml")
            assert status == 400 and body["error"]["code"] == "BAD_REQUEST"
            status, body = await http.get("v1/tools")
            assert status == 400 and "session_id" in body["error"]["message"]
            # 2. calls (1, 2); the tool acts through the system agent, on the HTTP agent's behalf
            status, body = await http.post("v1/tools/request_agent", {
                "session_id": sid, "args": {"agent": "answerer", "topic": "question", "payload": "2+2",
                                            "timeout_s": 10}})
            assert status == 200, body
            assert body["ok"] is True and body["result"] == {"answer": 4, "via_system_agent": True}
            status, body = await http.post("v1/tools/list_agents", {"session_id": sid, "args": {}})
            assert status == 200 and "tool-http" in {r["name"] for r in body["result"]}
            # 3. typed errors with their codes (calls 3, 4, 5); nothing unknown runs
            status, body = await http.post("v1/tools/request_agent", {"session_id": sid,
                                                                      "args": {"topic": "no agent"}})
            assert status == 400 and body["error"]["code"] == "VALIDATION_FAILED"
            assert "'agent'" in body["error"]["message"]
            status, body = await http.post("v1/tools/no_such_tool", {"session_id": sid, "args": {}})
            assert status == 404 and body["error"]["code"] == "NO_SUCH_TOOL"
            status, body = await http.post("v1/tools/send_message", {
                "session_id": sid, "args": {"agent": "answerer", "topic": "t", "payload": 1}})
            assert status == 403 and body["error"]["code"] == "APPROVAL_DENIED"
            status, body = await http.post("v1/tools/list_agents", {"session_id": sid, "args": [1]})
            assert status == 400 and body["error"]["code"] == "BAD_REQUEST"
            status, body = await http.post("v1/tools/list_agents", {"session_id": "ghost", "args": {}})
            assert status == 404 and body["error"]["code"] == "NO_SUCH_AGENT"
            # 4. the quota counts the HTTP agent's calls (unknown tools and 400s are not calls):
            # 6 per minute, so the 7th is refused
            for _ in range(2):
                status, body = await http.post("v1/tools/list_agents", {"session_id": sid})
                assert status == 200, body
            status, body = await http.post("v1/tools/list_agents", {"session_id": sid})
            assert status == 429 and body["error"]["code"] == "QUOTA_EXCEEDED"
            assert "calls_per_minute" in body["error"]["message"] and body["error"]["retry_after"] > 0
            # ... and it is per agent: the Python agent on the same daemon still may call
            assert isinstance(await py.call_tool("list_agents", {}), list)

    asyncio.run(scenario())
    assert a.alive()


# --------------------------------------------------------------------------- an HTTP agent is a mesh agent


def test_http_agent_round_trips_with_python_agents(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with client(a) as http, Agent("py-b", socket=b.socket) as py:
            me = await http.register("http-a", model="m-1", colour="#ff8800", project="p",
                                     capabilities=["answer"])
            sid = me["session_id"]
            assert me["sse_url"].endswith(f"/v1/agents/{sid}/events") and me["node"] == a.node_id
            stop = asyncio.Event()
            beat = asyncio.create_task(beating(http, sid, stop, context_used_pct=42.5, queue_depth=1,
                                               tasks_summary="1 open"))
            stream = await SseReader(http, f"v1/agents/{sid}/events").start()
            await wait_listed(py, "http-a")

            @py.on("ask")
            async def ask(msg: Any) -> Any:
                return {"echo": msg.payload, "from": msg.sender}

            # 1. a Python agent on b asks the HTTP agent; it answers over HTTP
            asked = asyncio.create_task(py.request("http-a", "verify", {"claim": "x"}, timeout=10))
            prompt = await stream.next("prompt")
            assert prompt["from"] == "py-b" and prompt["payload"] == {"claim": "x"}
            assert prompt["expects_response"] is True and prompt["topic"] == "verify"
            status, _ = await http.post(f"v1/messages/{prompt['msg_id']}/response",
                                        {"session_id": sid, "payload": {"verdict": True}})
            assert status == 200
            assert await asyncio.wait_for(asked, 10) == {"verdict": True}
            # an error answer is a HANDLER_ERROR for the requester
            asked = asyncio.create_task(py.request("http-a", "verify", {"claim": "y"}, timeout=10))
            prompt = await stream.next("prompt")
            await http.post(f"v1/messages/{prompt['msg_id']}/response", {"error": "cannot"})
            with pytest.raises(Exception, match="cannot"):
                await asyncio.wait_for(asked, 10)
            # delegation: the delegate's reply goes straight to the requester
            asked = asyncio.create_task(py.request("http-a", "verify", "z", timeout=10))
            prompt = await stream.next("prompt")
            status, _ = await http.post(f"v1/messages/{prompt['msg_id']}/delegate",
                                        {"target": "py-b", "topic": "ask"})
            assert status == 200
            assert await asyncio.wait_for(asked, 10) == {"echo": "z", "from": "http-a"}
            # the hop limit applies: delegating to itself again and again ends in HOP_LIMIT
            asked = asyncio.create_task(py.request("http-a", "loop", None, timeout=10))
            hops = 0
            while not asked.done():
                got = asyncio.create_task(stream.next("prompt", timeout=10))
                await asyncio.wait({got, asked}, return_when=asyncio.FIRST_COMPLETED)
                if got.done():
                    await http.post(f"v1/messages/{got.result()['msg_id']}/delegate", {"target": "http-a"})
                    hops += 1
                else:
                    got.cancel()
            with pytest.raises(HopLimit):
                await asked
            assert hops == 6  # the first receipt and 5 delegations (hop_limit 5); the 6th is refused
            # qos 1 applies: the send returns once on disk, the agent sees it once, marked qos 1
            await py.send("http-a", "note", {"durable": True}, qos=1)
            note = await stream.next("prompt")
            assert note["payload"] == {"durable": True} and note["qos"] == 1
            assert note["expects_response"] is False
            # 2. the HTTP agent asks the Python agent; the answer is a response event
            status, body = await http.post("v1/messages", {"sender_session": sid, "target": "py-b",
                                                           "topic": "ask", "prompt": "hi", "tasks": ["t1"]})
            assert status == 202
            resp = await stream.next("response")
            assert resp["msg_id"] == body["msg_id"] and resp["ok"] is True
            assert resp["payload"] == {"echo": {"prompt": "hi", "tasks": ["t1"]}, "from": "http-a"}
            # 3. request in one call
            status, body = await http.post("v1/request", {"session_id": sid, "target": "py-b", "topic": "ask",
                                                          "payload": 7, "timeout": 5})
            assert status == 200 and body["payload"] == {"echo": 7, "from": "http-a"}
            # a handler on the other side that does not exist: a typed error, not a hang
            status, body = await http.post("v1/request", {"session_id": sid, "target": "py-b",
                                                          "topic": "nothing-here", "timeout": 5})
            assert status == 502 and body["error"]["code"] == "HANDLER_ERROR"
            # 4. publications
            status, _ = await http.post("v1/subscribe", {"session_id": sid, "topic": "news"})
            assert status == 200

            async def published() -> bool:
                return await py.publish("news", {"n": 1}, reach=True) >= 1
            await async_wait_until(published, 10, interval=0.1, what="the subscription to reach b")
            pub = await stream.next("publication")
            assert pub["topic"] == "news" and pub["payload"] == {"n": 1} and pub["from"] == "py-b"
            # 5. telemetry and metadata reach the other daemon's directory
            async def telemetry_on_b() -> bool:
                rec = next((x for x in await py.agents() if x["name"] == "http-a"), None)
                return bool(rec and rec.get("telemetry", {}).get("context_used_pct") == 42.5
                            and rec["metadata"].get("model") == "m-1")
            await async_wait_until(telemetry_on_b, 10, what="http-a's telemetry on b")
            # 6. reconnect with Last-Event-ID: what was published meanwhile arrives
            await stream.stop()
            last = stream.last_id
            assert await py.publish("news", {"n": 2}, reach=True) >= 1
            resumed = await SseReader(http, f"v1/agents/{sid}/events", last_id=last).start()
            pub = await resumed.next("publication")
            assert pub["payload"] == {"n": 2}
            # 7. heartbeats stop: stale on b, then gone; a heartbeat brings it back
            stop.set()
            await beat

            async def state_on_b() -> str | None:
                rec = next((x for x in await py.agents() if x["name"] == "http-a"), None)
                return None if rec is None else str(rec.get("state"))
            await async_wait_until(lambda: _eq(state_on_b(), "stale"), 10, what="http-a stale on b")
            # the stream reports it too (the online event may come first: the watch ticks at 0.5 s)
            change = await resumed.next("agent_state")
            while not (change["name"] == "http-a" and change["new"] in ("stale", "absent")):
                change = await resumed.next("agent_state")
            assert change["node"] == a.node_id
            await resumed.stop()

    asyncio.run(scenario())


async def _eq(value: Any, expected: Any) -> bool:
    return (await value) == expected


def test_slow_stream_reader_is_disconnected_and_counted(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={"MESHD_HTTP_SSE_BUFFER": "16"})

    async def scenario() -> None:
        async with client(a) as http, Agent("pub-a", socket=a.socket) as pub:
            me = await http.register("slow-a")
            sid = me["session_id"]
            stop = asyncio.Event()
            beat = asyncio.create_task(beating(http, sid, stop))
            await http.post("v1/subscribe", {"session_id": sid, "topic": "flood"})
            # A reader that opens the stream and never reads: raw socket, tiny receive buffer.
            host, port = http.url.split("//")[1].rstrip("/").split(":")
            reader, writer = await asyncio.open_connection(host, int(port), limit=1024)
            sock = writer.get_extra_info("socket")
            import socket as pysocket
            sock.setsockopt(pysocket.SOL_SOCKET, pysocket.SO_RCVBUF, 4096)
            writer.write(f"GET /v1/agents/{sid}/events HTTP/1.1\r\nHost: x\r\n"
                         f"Authorization: {http.auth['Authorization']}\r\n\r\n".encode())
            await writer.drain()
            await reader.readuntil(b"\r\n\r\n")
            reader._transport.pause_reading()  # type: ignore[attr-defined]
            blob = "x" * 4000

            async def disconnected() -> bool:
                for _ in range(20):
                    await pub.publish("flood", blob)
                _status, body = await http.get("v1/node")
                return bool(body["gateway"]["slow_disconnects"] >= 1)
            await async_wait_until(disconnected, 60, interval=0.05, what="the slow reader to be dropped")
            writer.close()
            stop.set()
            await beat
            status, _body = await http.get("v1/node")
            assert status == 200 and a.alive()

    asyncio.run(scenario())


def test_closed_stream_is_noticed(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with client(a) as http:
            me = await http.register("leaver-a")
            reader = await SseReader(http, f"v1/agents/{me['session_id']}/events").start()
            _status, body = await http.get("v1/node")
            assert body["gateway"]["streams"] == 1
            await reader.stop()  # the client goes away without a word

            async def noticed() -> bool:
                _status, body = await http.get("v1/node")
                return bool(body["gateway"]["streams"] == 0 and body["gateway"]["closed_streams"] == 1)
            await async_wait_until(noticed, 15, interval=0.2, what="the closed stream to be noticed")
            _status, body = await http.get("v1/agents")
            assert any(x["name"] == "leaver-a" for x in body)  # the agent itself stays until it stops beating

    asyncio.run(scenario())
