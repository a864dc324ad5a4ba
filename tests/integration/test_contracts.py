"""Contracts across real daemons: typed handlers refuse bad payloads before they run, versions,
NACKs, contracts in the directory (docs/contracts.md)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from pydantic import BaseModel, Field

from meshd import (
    Agent,
    HandlerError,
    MeshError,
    Nack,
    NoSuchAgent,
    SchemaVersionUnsupported,
    TooLarge,
    ValidationFailed,
)
from meshd.testing import MeshdFactory, async_wait_until, wait_listed, wait_until
from meshd.wire import protocol as P


class VerifyRequest(BaseModel):
    claim: str = Field(min_length=1)
    confidence: float = Field(default=0.5, ge=0, le=1)


class VerifyRequestV2(BaseModel):
    statement: str
    sources: list[str]


class Verdict(BaseModel):
    ok: bool
    claim: str


def two_nodes(meshd_factory: MeshdFactory) -> tuple[Any, Any]:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    return a, b


def typed_researcher(b: Any, runs: list[Any], *, bad_reply: bool = False,
                     versions: list[Any] | None = None) -> Agent:
    researcher = Agent("researcher", socket=b.socket)

    @researcher.on("verify", accepts=VerifyRequest, returns=Verdict, version="1.2",
                   description="Check a claim", examples=[VerifyRequest(claim="water is wet")])
    async def verify(msg: Any) -> Any:
        runs.append(msg.payload)
        if versions is not None:
            versions.append(msg.schema_version)
        if bad_reply:
            return {"ok": "not a bool at all", "claim": 3}
        return Verdict(ok=True, claim=msg.payload.claim)

    return researcher


def test_typed_request_valid_and_invalid_payloads(meshd_factory: MeshdFactory) -> None:
    a, b = two_nodes(meshd_factory)
    runs: list[Any] = []

    async def scenario() -> None:
        async with typed_researcher(b, runs) as researcher, Agent("planner", socket=a.socket) as planner:
            await wait_listed(planner, "researcher")
            reply = await planner.request("researcher", "verify", VerifyRequest(claim="x"), timeout=5)
            assert reply == {"ok": True, "claim": "x"}
            assert isinstance(runs[0], VerifyRequest) and runs[0].confidence == 0.5
            # a minor-newer sender with an extra optional field: accepted (unknown fields ignored)
            reply = await planner.request("researcher", "verify", {"claim": "y", "lang": "en"},
                                          version="1.7", timeout=5)
            assert reply["claim"] == "y"
            assert len(runs) == 2
            # each kind of invalid payload: refused before the handler, naming the field
            cases = [({}, "claim"), ({"claim": ""}, "claim"), ({"claim": 5}, "claim"),
                     ({"claim": "z", "confidence": 7}, "confidence"), ("just a string", "(payload)")]
            for payload, field in cases:
                with pytest.raises(ValidationFailed) as info:
                    await planner.request("researcher", "verify", payload, timeout=5)
                err = info.value
                assert err.details["field"] == field, (payload, err.details)
                assert err.details["topic"] == "verify" and err.details["version"] == "1.2"
                assert "verify v1.2" in err.message and field in err.message
                assert err.sender == "researcher"
            assert len(runs) == 2, "no handler ran for an invalid payload"
            assert researcher.refused["VALIDATION_FAILED"] == len(cases)

    asyncio.run(scenario())
    letters = [d for d in b.dead_letters() if d["reason"] == "validation"]
    assert len(letters) == 5, letters
    assert b.query("node")["stats"]["refused_by_contract"] == 5


def test_typed_send_refused_reaches_sender_and_dead_letters(meshd_factory: MeshdFactory) -> None:
    a, b = two_nodes(meshd_factory)
    runs: list[Any] = []

    async def scenario() -> None:
        async with typed_researcher(b, runs) as researcher, Agent("planner", socket=a.socket) as planner:
            errors: asyncio.Queue[tuple[MeshError, str | None]] = asyncio.Queue()
            planner.on_error = lambda err, msg_id: errors.put_nowait((err, msg_id))
            await wait_listed(planner, "researcher")
            sent = await planner.send("researcher", "verify", {"confidence": 0.1})
            err, msg_id = await asyncio.wait_for(errors.get(), 5)
            assert isinstance(err, ValidationFailed) and msg_id == sent
            assert err.details["field"] == "claim"
            await planner.send("researcher", "verify", {"claim": "fine"})
            await async_wait_until(lambda: len(runs) == 1, 5, what="the valid send handled")
            assert researcher.refused == {"VALIDATION_FAILED": 1}
            # qos 1: the refusal is final, the unit acked (not retried), no notice (it was stored)
            await planner.send("researcher", "verify", {"claim": ""}, qos=1)

            async def done() -> bool:
                return bool((await planner.node_info())["qos1"]["pending"] == 0)
            await async_wait_until(done, 10, what="the refused qos-1 unit acked")
            assert researcher.refused == {"VALIDATION_FAILED": 2} and len(runs) == 1
            assert errors.empty()

    asyncio.run(scenario())
    reasons = [d["reason"] for d in b.dead_letters()]
    assert reasons.count("validation") == 2, reasons


def test_reply_checked_against_returns_on_the_answering_side(meshd_factory: MeshdFactory) -> None:
    a, b = two_nodes(meshd_factory)
    runs: list[Any] = []

    async def scenario() -> None:
        async with typed_researcher(b, runs, bad_reply=True), Agent("planner", socket=a.socket) as planner:
            await wait_listed(planner, "researcher")
            with pytest.raises(HandlerError) as info:
                await planner.request("researcher", "verify", {"claim": "x"}, timeout=5)
            assert "does not match its returns" in info.value.message and "ok" in info.value.message
            assert len(runs) == 1  # the handler ran: its bug, not the requester's validation error

    asyncio.run(scenario())


def test_schema_versions_side_by_side_and_refused(meshd_factory: MeshdFactory) -> None:
    a, b = two_nodes(meshd_factory)

    async def scenario() -> None:
        researcher = Agent("researcher", socket=b.socket)

        @researcher.on("verify", accepts=VerifyRequest, returns=Verdict, version="1.2")
        def v1(msg: Any) -> Any:
            return {"ok": True, "claim": msg.payload.claim}

        @researcher.on("verify", accepts=VerifyRequestV2, version="2.0")
        def v2(msg: Any) -> Any:
            return {"v": 2, "n": len(msg.payload.sources)}

        async with researcher, Agent("planner", socket=a.socket) as planner:
            await wait_listed(planner, "researcher")
            # no version: the oldest served (today's clients keep working)
            assert (await planner.request("researcher", "verify", {"claim": "c"}, timeout=5))["claim"] == "c"
            assert await planner.request("researcher", "verify", {"statement": "s", "sources": ["a", "b"]},
                                         version="2.0", timeout=5) == {"v": 2, "n": 2}
            with pytest.raises(ValidationFailed) as bad:  # v2's payload refused by v1's contract
                await planner.request("researcher", "verify", {"statement": "s"}, version="1.0", timeout=5)
            assert bad.value.details["field"] == "claim"
            with pytest.raises(SchemaVersionUnsupported) as info:
                await planner.request("researcher", "verify", {"claim": "c"}, version="3.1", timeout=5)
            assert info.value.details["supported"] == ["1.2", "2.0"]
            assert "1.2" in info.value.message and "2.0" in info.value.message
            assert researcher.refused == {"VALIDATION_FAILED": 1, "SCHEMA_VERSION": 1}

    asyncio.run(scenario())


def test_malformed_schema_version_refused_at_the_edge(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("x", socket=a.socket) as x, Agent("y", socket=a.socket) as y:
            y.on("t")(lambda msg: "hi")
            with pytest.raises(ValidationFailed):
                await x.request("y", "t", {}, version="1", timeout=5)  # refused by the client
            header_sent: list[Any] = []

            # a hostile client puts a bad 'sv' on the wire: the daemon refuses it at its edge
            async def raw() -> None:
                x._batcher.flush()
                from meshd.wire import protocol as P
                hdr = {P.KIND: "request", P.ID: P.new_request_id(), P.TO: "y", P.TOPIC: "t",
                       "sv": "1.2.3.4", P.BUDGET: 5000}
                fut = asyncio.get_running_loop().create_future()
                x._pending[hdr[P.ID]] = fut
                header_sent.append(hdr)
                x._push(P.frames(hdr, P.pack({})))
                with pytest.raises(ValidationFailed) as info:
                    await asyncio.wait_for(fut, 5)
                assert "'sv'" in info.value.message
            await raw()

    asyncio.run(scenario())
    assert a.query("node")["stats"]["malformed_bad_field"] >= 1


def test_nack_with_hints_for_requests_and_qos0_sends(meshd_factory: MeshdFactory) -> None:
    a, b = two_nodes(meshd_factory)

    async def scenario() -> None:
        async with Agent("worker", socket=b.socket) as worker, Agent("boss", socket=a.socket) as boss:
            @worker.on("job")
            def job(msg: Any) -> Any:
                if msg.payload == "busy":
                    raise Nack("busy", retry=True, retry_after=5)
                raise Nack("not mine", retry=False, fallback="expert")

            errors: asyncio.Queue[tuple[MeshError, str | None]] = asyncio.Queue()
            boss.on_error = lambda err, msg_id: errors.put_nowait((err, msg_id))
            await wait_listed(boss, "worker")
            with pytest.raises(Nack) as info:
                await boss.request("worker", "job", "busy", timeout=5)
            assert (info.value.retry, info.value.retry_after, info.value.fallback) == (True, 5.0, None)
            assert info.value.message == "busy" and info.value.sender == "worker"
            with pytest.raises(Nack) as info:
                await boss.request("worker", "job", "other", timeout=5)
            assert (info.value.retry, info.value.fallback) == (False, "expert")
            sent = await boss.send("worker", "job", "busy")
            err, msg_id = await asyncio.wait_for(errors.get(), 5)
            assert isinstance(err, Nack) and msg_id == sent
            assert (err.retry, err.retry_after) == (True, 5.0)
            assert worker.refused == {"NACK": 3}

    asyncio.run(scenario())
    assert [d["reason"] for d in b.dead_letters()].count("nack") == 1  # the send


def test_nack_on_qos1_redelivers_after_the_delay_or_dead_letters_at_once(meshd_factory: MeshdFactory) -> None:
    a, b = two_nodes(meshd_factory)

    async def scenario() -> None:
        async with Agent("worker", socket=b.socket) as worker, Agent("boss", socket=a.socket) as boss:
            runs: list[tuple[Any, float]] = []

            @worker.on("job")
            def job(msg: Any) -> Any:
                runs.append((msg.payload, time.monotonic()))
                if msg.payload == "later" and len([r for r in runs if r[0] == "later"]) == 1:
                    raise Nack("busy", retry=True, retry_after=1.5)
                if msg.payload == "never":
                    raise Nack("not mine", retry=False, fallback="expert")

            errors: asyncio.Queue[tuple[MeshError, str | None]] = asyncio.Queue()
            boss.on_error = lambda err, msg_id: errors.put_nowait((err, msg_id))
            await wait_listed(boss, "worker")
            await boss.send("worker", "job", "later", qos=1)
            await async_wait_until(lambda: len(runs) == 2, 15, what="the NACKed unit delivered again")
            assert [r[0] for r in runs] == ["later", "later"]
            assert runs[1][1] - runs[0][1] >= 1.4  # not before the handler's retry_after
            async def acked() -> bool:  # the second delivery's ack reaches the outbox
                return bool((await boss.node_info())["qos1"]["pending"] == 0)
            await async_wait_until(acked, 10, what="the redelivered unit acked")
            assert (await boss.node_info())["qos1"]["nack_retries"] == 1
            sent = await boss.send("worker", "job", "never", qos=1)
            err, msg_id = await asyncio.wait_for(errors.get(), 10)
            assert isinstance(err, Nack) and msg_id == sent and err.fallback == "expert"
            assert [r[0] for r in runs].count("never") == 1  # not retried
            assert (await boss.node_info())["qos1"]["pending"] == 0  # given up before NACK was told

    asyncio.run(scenario())
    letters = [d for d in a.dead_letters() if d["reason"] == "nack"]
    assert len(letters) == 1, a.dead_letters()


def restart(proc: Any) -> None:
    proc.stop()
    proc.start()


def _hb_bytes(proc: Any) -> int:
    return int(proc.query("node")["stats"]["hb_body_bytes"])


def test_contracts_travel_to_a_third_daemon_and_survive_restarts(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    c = meshd_factory.spawn("c")
    meshd_factory.wait_mesh([a, b, c])

    async def scenario() -> None:
        # the same name untyped, then typed: what a heartbeat carries must not change
        async with Agent("researcher", socket=b.socket):
            async with Agent("probe-c", socket=c.socket) as probe:
                await wait_listed(probe, "researcher")
            before = await asyncio.to_thread(_hb_bytes, b)
        runs: list[Any] = []
        versions: list[Any] = []
        async with typed_researcher(b, runs, versions=versions) as researcher:
            assert len(P.pack(researcher.contracts())) > 300  # two JSON Schemas, an example
            async with Agent("watcher", socket=c.socket) as watcher:
                async def typed_seen() -> bool:
                    return bool(await watcher.describe("researcher"))
                await async_wait_until(typed_seen, 10, what="the contracts at c")
                [rec] = await watcher.describe("researcher")
                assert rec["topic"] == "verify" and rec["version"] == "1.2"
                assert rec["accepts"]["required"] == ["claim"] and rec["description"] == "Check a claim"
                assert rec["examples"] == [{"claim": "water is wet", "confidence": 0.5}]
                listed = {x["name"]: x for x in await watcher.agents()}
                assert listed["researcher"]["contracts"] == [rec]
                after = await asyncio.to_thread(_hb_bytes, b)
                # heartbeats never carry contracts: the body does not grow by their size (it varies
                # by a few dozen bytes with the agents' telemetry: counters, queue depth, lag)
                contract_bytes = len(P.pack(researcher.contracts()))
                print(f"heartbeat body: {before} bytes with the untyped agent, {after} with the typed one "
                      f"(its contracts: {contract_bytes} bytes)")
                assert after - before < 100 < contract_bytes, (before, after, contract_bytes)
                # check=True fails at the sender, with no round trip to the receiver
                with pytest.raises(ValidationFailed) as info:
                    await watcher.request("researcher", "verify", {"claim": 3}, check=True, timeout=5)
                assert info.value.details["field"] == "claim" and "before sending" in info.value.message
                with pytest.raises(SchemaVersionUnsupported):
                    await watcher.request("researcher", "verify", {"claim": "x"}, version="4.0", check=True,
                                          timeout=5)
                assert researcher.refused == {} and runs == []
                assert await watcher.request("researcher", "verify", VerifyRequest(claim="ok"), check=True,
                                             timeout=5) == {"ok": True, "claim": "ok"}
                assert versions == ["1.2"]  # a checked payload names the version it was checked against

            # c restarts: it learns the contracts again from b's full directory (HELLO)
            await asyncio.to_thread(restart, c)
            await asyncio.to_thread(meshd_factory.wait_mesh, [a, b, c])
            async with Agent("watcher", socket=c.socket) as watcher:
                await async_wait_until(lambda: watcher.describe("researcher"), 10,
                                       what="the contracts at c after its restart")
            # b restarts: the agent registers again with its contracts, and c sees them again
            await asyncio.to_thread(restart, b)
            await asyncio.to_thread(meshd_factory.wait_mesh, [a, b, c])
            async with Agent("watcher", socket=c.socket) as watcher:
                async def again() -> bool:
                    try:
                        return bool(await watcher.describe("researcher"))
                    except MeshError:
                        return False
                await async_wait_until(again, 15, what="the contracts at c after b's restart")

    asyncio.run(scenario())


def test_contracts_over_the_bound_are_refused_too_large(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={"MESHD_CONTRACTS_MAX_BYTES": "256"})

    async def scenario() -> None:
        runs: list[Any] = []
        with pytest.raises(TooLarge) as info:
            async with typed_researcher(a, runs):
                pass
        assert "contracts_max_bytes=256" in info.value.message
        async with Agent("plain", socket=a.socket) as plain:  # untyped agents are not affected
            assert await plain.describe("plain") == []
            with pytest.raises(NoSuchAgent):
                await plain.describe("nobody")

    asyncio.run(scenario())


CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]


def _ctl(proc: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CTL, "--socket", str(proc.socket), *args], capture_output=True, text=True,
                          timeout=30)


def _get(url: str, token: str) -> tuple[int, Any]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_meshctl_gateway_and_tools_show_contracts(meshd_factory: MeshdFactory) -> None:
    a, b = two_nodes(meshd_factory)

    async def scenario() -> None:
        runs: list[Any] = []
        async with typed_researcher(b, runs), Agent("asker", socket=a.socket) as asker:
            await wait_listed(asker, "researcher")
            await async_wait_until(lambda: asker.describe("researcher"), 10, what="contracts at a")
            described = await asyncio.to_thread(_ctl, a, "describe", "researcher")
            assert described.returncode == 0, described.stderr
            text = described.stdout
            assert "verify v1.2: Check a claim" in text and "claim: string (required)" in text
            assert "confidence: number = 0.5" in text and "ok: boolean (required)" in text
            assert "meshctl request researcher verify" in text and "--version 1.2" in text
            listed = await asyncio.to_thread(_ctl, a, "agents", "--contracts")
            assert "verify@1.2" in listed.stdout
            exported = await asyncio.to_thread(_ctl, a, "tools", "schema", "--format", "openai", "--skills")
            functions = {f["function"]["name"]: f["function"] for f in json.loads(exported.stdout)}
            assert functions["researcher__verify"]["parameters"]["required"] == ["claim"]
            assert "request_agent" in functions  # the daemon's own tools beside the skills
            plain = await asyncio.to_thread(_ctl, a, "agents", "--json")
            assert "contracts" not in json.loads(plain.stdout)[0]
            # a request with --check refused before it leaves, exit code non-zero, field named
            bad = await asyncio.to_thread(_ctl, a, "request", "researcher", "verify", '{"claim": 1}',
                                          "--check")
            assert bad.returncode != 0 and "claim" in (bad.stderr + bad.stdout)
            # the gateway
            gw = a.gateway()
            status, body = await asyncio.to_thread(_get, gw.url + "v1/agents/researcher/contracts", gw.token)
            assert status == 200 and body["name"] == "researcher" and body["contracts"][0]["version"] == "1.2"
            status, body = await asyncio.to_thread(_get, gw.url + "v1/agents/nobody/contracts", gw.token)
            assert status == 404 and body["error"]["code"] == "NO_SUCH_AGENT"
            # the tools: capability search matches a contract's topic; describe_agent has the schemas
            found = await asyncio.wait_for(asker.call_tool("list_agents", {"capability": "verify"}), 10)
            assert [x["name"] for x in found] == ["researcher"]
            assert found[0]["skills"] == [{"topic": "verify", "version": "1.2",
                                           "description": "Check a claim"}]
            assert await asker.call_tool("list_agents", {"capability": "nothing-like-it"}) == []
            described_tool = await asker.call_tool("describe_agent", {"agent": "researcher"})
            assert described_tool["skills"][0]["accepts"]["required"] == ["claim"]
            reply = await asker.call_tool("request_agent", {"agent": "researcher", "topic": "verify",
                                                            "payload": {"claim": "t"}, "version": "1.0"})
            assert reply == {"ok": True, "claim": "t"}
            with pytest.raises(ValidationFailed):
                await asker.call_tool("request_agent", {"agent": "researcher", "topic": "verify",
                                                        "payload": {"claim": ""}})

    asyncio.run(scenario())


def test_mcp_sees_one_tool_per_skill_calls_it_and_hears_list_changed(meshd_factory: MeshdFactory) -> None:
    """An MCP client (the SDK's 2025-era session and its 2026-era Client) learns the typed skill of
    an agent it never heard of, from tools/list_changed, and calls it."""
    from mcp import Client
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client
    from mcp.shared.subscriptions import ToolsListChanged

    a, b = two_nodes(meshd_factory)
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "meshd", "mcp", "--socket", str(a.socket), "--name", "llm"])
    changed = asyncio.Event()

    async def on_message(message: Any) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/tools/list_changed":
            changed.set()

    async def scenario() -> None:
        runs: list[Any] = []
        async with stdio_client(params) as (read, write), \
                ClientSession(read, write, message_handler=on_message) as old_era, \
                Client(StdioServerParameters(command=sys.executable, args=[
                    "-m", "meshd", "mcp", "--socket", str(a.socket), "--name", "llm2",
                    "--skill", "researcher__*"])) as new_era:
            await old_era.initialize()
            before = {t.name for t in (await old_era.list_tools()).tools}
            assert not any("__" in name for name in before)
            async with new_era.listen(tools_list_changed=True) as sub, typed_researcher(b, runs), \
                    Agent("other", socket=b.socket) as other:
                @other.on("count", accepts={"type": "integer"}, version="3.1")
                def count(msg: Any) -> Any:
                    return msg.payload + 1

                event = await asyncio.wait_for(anext(aiter(sub)), 15)
                assert event == ToolsListChanged()
                await asyncio.wait_for(changed.wait(), 15)

                async def both_listed() -> Any:
                    listed = {t.name: t for t in (await old_era.list_tools()).tools}
                    return listed if {"researcher__verify", "other__count"} <= set(listed) else None
                tools = await async_wait_until(both_listed, 10, what="both skills listed")
                skill = tools["researcher__verify"]
                assert skill.input_schema["required"] == ["claim"]
                assert "Check a claim" in (skill.description or "")
                res = await old_era.call_tool("researcher__verify", {"claim": "the sky is blue"})
                assert not res.is_error, res.content[0].text
                assert json.loads(res.content[0].text) == {"ok": True, "claim": "the sky is blue"}
                bad = await old_era.call_tool("researcher__verify", {"claim": ""})
                assert bad.is_error and bad.content[0].text.startswith("VALIDATION_FAILED")
                # a non-object payload is wrapped as {"payload": ...}
                assert tools["other__count"].input_schema["required"] == ["payload"]
                res = await old_era.call_tool("other__count", {"payload": 41})
                assert json.loads(res.content[0].text) == 42
                # the allow-list: the second server shows the researcher's skills only
                names = {t.name for t in (await new_era.list_tools()).tools}
                assert "researcher__verify" in names and "other__count" not in names
            assert len(runs) == 1  # the invalid call never reached the handler

    asyncio.run(scenario())


def test_every_message_carries_an_iso_utc_timestamp(meshd_factory: MeshdFactory) -> None:
    import datetime

    a, b = two_nodes(meshd_factory)

    async def scenario() -> None:
        async with Agent("x", socket=a.socket) as x, Agent("y", socket=b.socket) as y:
            seen: asyncio.Queue[Any] = asyncio.Queue()

            @y.on("t")
            def t(msg: Any) -> Any:
                seen.put_nowait(msg)
                return "ok"

            await wait_listed(x, "y")
            await x.request("y", "t", None, timeout=5)
            await x.send("y", "t", None)
            for _ in range(2):
                msg = await asyncio.wait_for(seen.get(), 5)
                assert msg.timestamp is not None and msg.timestamp.endswith("Z"), msg.timestamp
                parsed = datetime.datetime.fromisoformat(msg.timestamp.replace("Z", "+00:00"))
                assert parsed.utcoffset() == datetime.timedelta(0)

    asyncio.run(scenario())


def test_http_agent_registers_json_schema_contracts_validated_at_the_gateway(
        meshd_factory: MeshdFactory) -> None:
    """A non-Python agent (plain HTTP) advertises a JSON Schema contract; a Python agent on another
    daemon reads it, a bad payload is refused before any prompt event, a good one arrives."""
    import aiohttp

    a, b = two_nodes(meshd_factory)
    gw = a.gateway()
    auth = {"Authorization": f"Bearer {gw.token}"}
    contract = {"topic": "translate", "version": "2.1", "description": "Translate text",
                "accepts": {"type": "object", "required": ["text", "to"],
                            "properties": {"text": {"type": "string", "minLength": 1},
                                           "to": {"enum": ["de", "fr"]}}},
                "returns": {"type": "object", "required": ["text"]},
                "examples": [{"text": "hello", "to": "de"}]}

    async def scenario() -> None:
        async with aiohttp.ClientSession() as s, Agent("py", socket=b.socket) as py:
            async with s.post(gw.url + "v1/agents/register", headers=auth,
                              json={"name": "translator", "contracts": [contract]}) as r:
                assert r.status == 200, await r.text()
                sid = (await r.json())["session_id"]
            await wait_listed(py, "translator")
            await async_wait_until(lambda: py.describe("translator"), 10, what="the contract at b")
            [rec] = await py.describe("translator")
            assert rec["version"] == "2.1" and rec["accepts"]["required"] == ["text", "to"]
            async with s.get(gw.url + "v1/agents/translator/contracts", headers=auth) as r:
                assert (await r.json())["contracts"][0]["topic"] == "translate"
            events: asyncio.Queue[Any] = asyncio.Queue()

            async def read_events() -> None:
                async with s.get(gw.url + f"v1/agents/{sid}/events", headers=auth,
                                 timeout=aiohttp.ClientTimeout(total=None)) as r:
                    name = ""
                    async for raw in r.content:
                        line = raw.decode().rstrip("\n")
                        if line.startswith("event: "):
                            name = line[7:]
                        elif line.startswith("data: ") and name == "prompt":
                            events.put_nowait(json.loads(line[6:]))
            reader = asyncio.create_task(read_events())
            try:
                with pytest.raises(ValidationFailed) as info:
                    await py.request("translator", "translate", {"text": "hi", "to": "xx"}, timeout=5)
                assert info.value.details["field"] == "to" and info.value.sender == "translator"
                with pytest.raises(SchemaVersionUnsupported):
                    await py.request("translator", "translate", {"text": "hi", "to": "de"}, version="1.0",
                                     timeout=5)
                asked = asyncio.create_task(py.request("translator", "translate", {"text": "hi", "to": "de"},
                                                       version="2.0", timeout=10))
                prompt = await asyncio.wait_for(events.get(), 10)
                assert prompt["payload"] == {"text": "hi", "to": "de"}  # the first prompt: the valid one
                async with s.post(gw.url + f"v1/messages/{prompt['msg_id']}/response", headers=auth,
                                  json={"session_id": sid, "payload": {"text": "hallo"}}) as r:
                    assert r.status == 200
                assert await asyncio.wait_for(asked, 10) == {"text": "hallo"}
                assert events.empty()
                # a response that does not fit the contract's returns: the HTTP agent hears 400
                # naming the field, the requester HANDLER_ERROR (the answering side's bug)
                asked = asyncio.create_task(py.request("translator", "translate", {"text": "a", "to": "fr"},
                                                       timeout=10))
                prompt = await asyncio.wait_for(events.get(), 10)
                async with s.post(gw.url + f"v1/messages/{prompt['msg_id']}/response", headers=auth,
                                  json={"session_id": sid, "payload": {"nope": 1}}) as r:
                    assert r.status == 400
                    assert "text" in (await r.json())["error"]["message"]
                with pytest.raises(HandlerError):
                    await asyncio.wait_for(asked, 10)
                # an untyped topic of the same HTTP agent keeps working as before
                asked = asyncio.create_task(py.request("translator", "chat", "anything", timeout=10))
                prompt = await asyncio.wait_for(events.get(), 10)
                assert prompt["topic"] == "chat"
                async with s.post(gw.url + f"v1/messages/{prompt['msg_id']}/response", headers=auth,
                                  json={"session_id": sid, "payload": "ok"}) as r:
                    assert r.status == 200
                assert await asyncio.wait_for(asked, 10) == "ok"
                # a malformed contract is refused at the gateway's edge
                async with s.post(gw.url + "v1/agents/register", headers=auth,
                                  json={"name": "bad", "contracts": [{"topic": "t", "version": "one"}]}) as r:
                    assert r.status == 400
            finally:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

    asyncio.run(scenario())


def test_stack_traces_travel_only_when_the_agent_opts_in(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")

    async def scenario() -> None:
        async with Agent("quiet", socket=a.socket) as quiet, \
                Agent("chatty", socket=a.socket, debug=True) as chatty, \
                Agent("asker", socket=a.socket) as asker:
            def broken(msg: Any) -> Any:
                raise KeyError("missing-thing")

            quiet.on("t")(broken)
            chatty.on("t")(broken)
            with pytest.raises(HandlerError) as info:
                await asker.request("quiet", "t", None, timeout=5)
            assert info.value.remote_type == "KeyError" and "trace" not in info.value.details
            with pytest.raises(HandlerError) as info:
                await asker.request("chatty", "t", None, timeout=5)
            trace = info.value.details["trace"]
            assert "Traceback" in trace and "KeyError" in trace and "raise KeyError" in trace

    asyncio.run(scenario())


def test_blocking_agent_declares_a_typed_handler_after_connecting(meshd_factory: MeshdFactory) -> None:
    from meshd import BlockingAgent

    a = meshd_factory.spawn("a")
    with BlockingAgent("sync-typed", socket=a.socket) as typed, \
            BlockingAgent("sync-asker", socket=a.socket) as asker:
        typed.on("verify", accepts=VerifyRequest, version="1.0")(lambda msg: {"claim": msg.payload.claim})
        wait_until(lambda: asker.describe("sync-typed"), 10, what="the contract advertised")
        assert asker.request("sync-typed", "verify", {"claim": "c"}, timeout=5) == {"claim": "c"}
        with pytest.raises(ValidationFailed):
            asker.request("sync-typed", "verify", {}, timeout=5)


def test_typed_subscriber_validates_publications(meshd_factory: MeshdFactory) -> None:
    a, b = two_nodes(meshd_factory)

    async def scenario() -> None:
        sub = Agent("sub", socket=b.socket)
        got: asyncio.Queue[Any] = asyncio.Queue()

        @sub.on("claims", accepts=VerifyRequest, version="1.0")
        def claims(msg: Any) -> None:
            got.put_nowait(msg.payload)

        async with sub, Agent("pub", socket=a.socket) as pub:
            await sub.subscribe("claims")

            async def reached() -> bool:
                return bool(await pub.publish("claims", VerifyRequest(claim="warm"), reach=True,
                                              version="1.0"))
            await async_wait_until(reached, 10, what="the subscription at a")
            assert (await asyncio.wait_for(got.get(), 5)).claim == "warm"
            await pub.publish("claims", {"claim": ""}, reach=True)
            await pub.publish("claims", {"claim": "ok"}, reach=True)
            second = await asyncio.wait_for(got.get(), 5)
            assert second.claim == "ok" and sub.refused == {"VALIDATION_FAILED": 1}

    asyncio.run(scenario())
