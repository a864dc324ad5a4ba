"""``meshd mcp`` driven by the official TypeScript SDK's client (npm ``@modelcontextprotocol/sdk``,
pinned in tests/js/package.json), over stdio and over Streamable HTTP, against a real daemon
(an independent client, written from the spec).

The node script (tests/js/mcp_client.mjs) lists tools, calls one, asks an agent that does not
exist (NO_SUCH_AGENT within a generous bound, vs 30 s before the fix), runs a request that lasts
three times the client's own request timeout (3 s here, with ``resetTimeoutOnProgress``: the same
thing the issue's 90-second request against the SDK's 60-second default proves, in 9 s), cancels
a call (the mesh handler sees the cancel), subscribes to ``meshd://inbox`` and hears
``notifications/resources/updated`` and the pushed ``notifications/claude/channel`` when a
message arrives, then reads it with ``wait_message``. Skips, saying why, without node or
without ``npm ci`` in tests/js.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent, Message
from meshd.testing import MeshdFactory, MeshdProcess, wait_listed

pytest.importorskip("mcp", reason="the 'mcp' extra is not installed")

JS_DIR = Path(__file__).resolve().parents[1] / "js"
SCRIPT = JS_DIR / "mcp_client.mjs"
NODE = shutil.which("node")
CLIENT_TIMEOUT_MS = 3000  # with notes every second: a 3x margin on a loaded machine
LONG_MS = 3 * CLIENT_TIMEOUT_MS

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed (the TypeScript SDK client needs it)"),
    pytest.mark.skipif(not (JS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir(),
                       reason="tests/js/node_modules is missing: run `cd tests/js && npm ci`"),
]


class SlowAgent:
    """The mesh side: an agent with a long handler (progress every second), one that waits until
    cancelled, and one that sends the MCP agent a message before it answers."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.cancelled = asyncio.Event()
        agent.on("long")(self.long)
        agent.on("hang")(self.hang)
        agent.on("poke")(self.poke)

    async def long(self, msg: Message) -> Any:
        steps = int(msg.payload) // 1000
        for i in range(steps):
            await msg.progress(f"step {i + 1} of {steps}")
            await asyncio.sleep(1.0)  # the work this request stands for
        return {"done": steps}

    async def hang(self, msg: Message) -> Any:
        await msg.progress("started")
        try:
            await asyncio.Event().wait()  # until the requester cancels
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def poke(self, msg: Message) -> Any:
        await self.agent.send(str(msg.payload), "note", {"hello": "from slow"})
        return "poked"


async def run_node(config: dict[str, Any]) -> dict[str, Any]:
    assert NODE is not None
    proc = await asyncio.create_subprocess_exec(NODE, str(SCRIPT), json.dumps(config), cwd=JS_DIR,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, f"node client failed ({proc.returncode}):\n{err.decode()}"
    return dict(json.loads(out.decode().strip().splitlines()[-1]))


def check_report(report: dict[str, Any], slow: SlowAgent, self_name: str) -> None:
    print(f"{report['transport']}: NO_SUCH_AGENT in {report['unknown']['ms']:.0f} ms; a {LONG_MS} ms request "
          f"with a {CLIENT_TIMEOUT_MS} ms client timeout answered in {report['long']['ms']:.0f} ms after "
          f"{len(report['long']['progress'])} progress notifications; cancel answered in "
          f"{report['cancel'].get('ms', 0):.0f} ms")
    assert {"list_agents", "request_agent", "wait_message", "reply_message"} <= set(report["tools"])
    assert {"slow", self_name} <= set(report["agents"])
    assert report["capabilities"]["resources"]["subscribe"] is True
    assert report["capabilities"]["experimental"] == {"claude/channel": {}}

    unknown = report["unknown"]
    assert unknown["is_error"] and unknown["text"].startswith("NO_SUCH_AGENT"), unknown
    assert unknown["ms"] < 3000, unknown  # at once (it was 30 s with timeout_s 5)

    long = report["long"]
    assert not long["is_error"] and json.loads(long["text"]) == {"done": LONG_MS // 1000}, long
    assert long["ms"] > 2 * CLIENT_TIMEOUT_MS  # it outlived the client's own timeout
    notes = [p.get("message") for p in long["progress"]]
    assert "step 1 of 9" in notes and "step 9 of 9" in notes, notes  # the handler's notes, relayed
    values = [p["progress"] for p in long["progress"]]
    assert values == sorted(values) and len(set(values)) == len(values)  # progress only grows

    assert report["cancel"]["rejected"], report["cancel"]
    assert slow.cancelled.is_set()  # the mesh request was cancelled, down to the handler

    assert report["updated"] == {"uri": "meshd://inbox"}
    pushed = report["pushed"]
    assert pushed["meta"]["sender"] == "slow" and pushed["meta"]["topic"] == "note", pushed
    assert "from slow" in pushed["content"]
    assert report["inbox"]["unread"] == 1 and report["inbox"]["messages"][0]["topic"] == "note"
    assert report["message"]["payload"] == {"hello": "from slow"} and report["message"]["from"] == "slow"


def test_ts_sdk_client_over_stdio(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("slow", socket=a.socket) as agent:
            slow = SlowAgent(agent)
            report = await run_node({
                "transport": "stdio", "command": sys.executable,
                "args": ["-m", "meshd", "mcp", "--socket", str(a.socket), "--name", "ts-stdio", "--push",
                         "--progress-every", "1"],
                "slow": "slow", "self": "ts-stdio", "push": True,
                "client_timeout_ms": CLIENT_TIMEOUT_MS, "long_ms": LONG_MS})
            check_report(report, slow, "ts-stdio")

    asyncio.run(scenario())


async def start_http_server(a: MeshdProcess, name: str) -> tuple[asyncio.subprocess.Process, dict[str, Any]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meshd", "mcp", "--socket", str(a.socket), "--name", name, "--push",
        "--progress-every", "1", "--http", "127.0.0.1:0", stderr=subprocess.PIPE)
    assert proc.stderr is not None
    while True:  # the server says where it listens once the socket is bound
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        assert line, "meshd mcp --http exited before it listened"
        if "Streamable HTTP at" in line:
            break
    return proc, server_files(a.socket.parent, name)


def server_files(runtime_dir: Path, name: str) -> dict[str, Any]:
    """The URL file of ``meshd mcp --http``, with the token from the 0600 file it names."""
    info: dict[str, Any] = json.loads((runtime_dir / f"mcp-{name}.json").read_text())
    token_file = Path(info["token_file"])
    assert token_file.stat().st_mode & 0o777 == 0o600
    info["token"] = token_file.read_text().strip()
    return info


def http_status(url: str, headers: dict[str, str]) -> int:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "content-type": "application/json", "accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_ts_sdk_client_over_streamable_http(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("slow", socket=a.socket) as agent:
            slow = SlowAgent(agent)
            server, info = await start_http_server(a, "ts-http")
            try:
                url = info["url"]
                assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
                await wait_listed(agent, "ts-http")
                # no token, a wrong one, a foreign Origin or Host: refused before any MCP handling
                assert await asyncio.to_thread(http_status, url, {}) == 401
                assert await asyncio.to_thread(http_status, url, {"authorization": "Bearer nope"}) == 401
                assert await asyncio.to_thread(http_status, url, {
                    "authorization": f"Bearer {info['token']}", "origin": "http://evil.example"}) == 403
                assert await asyncio.to_thread(http_status, url, {  # DNS rebinding: a foreign Host
                    "authorization": f"Bearer {info['token']}", "host": "evil.example"}) == 421
                report = await run_node({
                    "transport": "http", "url": url, "token": info["token"], "slow": "slow",
                    "self": "ts-http", "push": True,
                    "client_timeout_ms": CLIENT_TIMEOUT_MS, "long_ms": LONG_MS})
                check_report(report, slow, "ts-http")
            finally:
                server.terminate()
                rc = await asyncio.wait_for(server.wait(), 20)
            assert rc == 0
            assert not (a.socket.parent / "mcp-ts-http.json").exists()  # the URL file goes with it

    asyncio.run(scenario())


def test_ts_sdk_client_hears_list_changed_and_calls_a_skill(meshd_factory: MeshdFactory) -> None:
    """The TypeScript SDK's Client: a typed agent joins, notifications/tools/list_changed comes,
    and the skill is a tool of its own (the contract's schema, called with its version)."""
    from pydantic import BaseModel

    class Claim(BaseModel):
        claim: str

    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        typed = Agent("researcher", socket=a.socket)

        @typed.on("verify", accepts=Claim, version="1.3", description="Check a claim")
        def verify(msg: Any) -> Any:
            return {"ok": True, "claim": msg.payload.claim}

        async with Agent("joiner", socket=a.socket) as joiner:
            @joiner.on("join")
            async def join(msg: Any) -> Any:
                await typed.connect()
                return "joined"

            try:
                report = await run_node({"transport": "stdio", "command": sys.executable,
                                         "args": ["-m", "meshd", "mcp", "--socket", str(a.socket),
                                                  "--name", "ts-skills"],
                                         "skills": {"joiner": "joiner", "tool": "researcher__verify",
                                                    "args": {"claim": "water is wet"}}})
            finally:
                await typed.close()
        assert report["capabilities"]["tools"]["listChanged"] is True
        assert "researcher__verify" not in report["before"] and report["list_changed"] is True
        assert report["tool"]["inputSchema"]["required"] == ["claim"], report["tool"]
        assert "Check a claim" in report["tool"]["description"]
        assert not report["call"]["is_error"], report["call"]
        assert json.loads(report["call"]["text"]) == {"ok": True, "claim": "water is wet"}

    asyncio.run(scenario())
