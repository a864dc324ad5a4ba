"""Contracts across real daemons: typed handlers refuse bad payloads before they run, versions,
NACKs, contracts in the directory (docs/contracts.md)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pydantic import BaseModel, Field

from meshd import Agent, HandlerError, MeshError, Nack, SchemaVersionUnsupported, ValidationFailed
from meshd.testing import MeshdFactory, async_wait_until, wait_listed


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


def typed_researcher(b: Any, runs: list[Any], *, bad_reply: bool = False) -> Agent:
    researcher = Agent("researcher", socket=b.socket)

    @researcher.on("verify", accepts=VerifyRequest, returns=Verdict, version="1.2",
                   description="Check a claim", examples=[VerifyRequest(claim="water is wet")])
    async def verify(msg: Any) -> Any:
        runs.append(msg.payload)
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

    asyncio.run(scenario())
    reasons = [d["reason"] for d in b.dead_letters()]
    assert reasons.count("validation") == 1, reasons


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
            qos_a = (await boss.node_info())["qos1"]
            assert qos_a["nack_retries"] == 1 and qos_a["pending"] == 0
            sent = await boss.send("worker", "job", "never", qos=1)
            err, msg_id = await asyncio.wait_for(errors.get(), 10)
            assert isinstance(err, Nack) and msg_id == sent and err.fallback == "expert"
            assert [r[0] for r in runs].count("never") == 1  # not retried
            assert (await boss.node_info())["qos1"]["pending"] == 0

    asyncio.run(scenario())
    letters = [d for d in a.dead_letters() if d["reason"] == "nack"]
    assert len(letters) == 1, a.dead_letters()
