"""Scatter-gather on real daemons: want below and above the targets, a target killed with
kill -9, one slow past the timeout, cancel; the targets by name, capability and subscription."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from typing import Any

import aiohttp
import pytest

from meshd import Agent, BlockingAgent
from meshd.testing import MeshdFactory, MeshdProcess, async_wait_until, wait_listed

EXPERT = """
import asyncio, sys
from meshd import Agent

async def main():
    async with Agent(sys.argv[2], socket=sys.argv[1], capabilities=["expert"]) as me:
        @me.on("ask")
        async def ask(msg):
            print("started", flush=True)
            await asyncio.sleep(60)
        await asyncio.sleep(120)

asyncio.run(main())
"""


def two(meshd_factory: MeshdFactory) -> tuple[MeshdProcess, MeshdProcess]:
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b")
    meshd_factory.wait_mesh([a, b])
    return a, b


class Experts:
    """Agents with capability "expert" on both daemons: ``fast`` ones answer at once, ``slow``
    ones wait for a cancel (bounded) and count it."""

    def __init__(self, a: MeshdProcess, b: MeshdProcess, fast: int, slow: int) -> None:
        socks = [a.socket, b.socket]
        self.agents = [Agent(f"fast{i}", socket=socks[i % 2], capabilities=["expert"]) for i in range(fast)]
        self.agents += [Agent(f"slow{i}", socket=socks[(i + 1) % 2], capabilities=["expert"])
                        for i in range(slow)]
        self.cancelled: list[str] = []
        self.started: list[str] = []
        self.running = 0  # slow handlers waiting for their cancel now

    async def __aenter__(self) -> Experts:
        for ag in self.agents:
            await ag.connect()
            self._serve(ag)
        return self

    def _serve(self, ag: Agent) -> None:
        @ag.on("ask")
        async def ask(msg: Any) -> Any:
            self.started.append(ag.name)
            if ag.name.startswith("fast"):
                return {"by": ag.name, "q": msg.payload}
            self.running += 1
            try:
                await asyncio.wait_for(msg.cancelled.wait(), 20)
                self.cancelled.append(ag.name)
            except TimeoutError:
                pass
            finally:
                self.running -= 1
            return None

    async def __aexit__(self, *exc: object) -> None:
        for ag in self.agents:
            await ag.close()


def test_want_below_the_targets_cancels_the_rest(meshd_factory: MeshdFactory) -> None:
    a, b = two(meshd_factory)

    async def scenario() -> None:
        async with Experts(a, b, fast=2, slow=2) as ex, Agent("boss", socket=a.socket) as boss:
            await wait_listed(boss, "fast0", "fast1", "slow0", "slow1")
            g = boss.gather("ask", 7, capability="expert", want=2, timeout=15)
            replies = [r async for r in g]
            assert sorted(r.sender for r in replies) == ["fast0", "fast1"]
            assert all(r.payload == {"by": r.sender, "q": 7} for r in replies)
            s = g.summary
            assert s is not None and s.ended == "want"
            assert sorted(s.targets) == ["fast0", "fast1", "slow0", "slow1"]
            assert sorted(s.cancelled) == ["slow0", "slow1"] and not s.timed_out and not s.errors
            # the slow handlers that had started hear the cancel
            await async_wait_until(lambda: sorted(ex.cancelled) == sorted(
                n for n in ex.started if n.startswith("slow")))

    asyncio.run(scenario())


def test_want_above_the_targets_ends_when_all_answered(meshd_factory: MeshdFactory) -> None:
    a, b = two(meshd_factory)

    async def scenario() -> None:
        async with Experts(a, b, fast=3, slow=0), Agent("boss", socket=b.socket) as boss:
            await wait_listed(boss, "fast0", "fast1", "fast2")
            replies, s = await boss.gather("ask", "q", capability="expert", want=10, timeout=15).collect()
            assert sorted(r.sender for r in replies) == ["fast0", "fast1", "fast2"]
            assert (s.ended, sorted(s.replied), s.cancelled) == ("all", ["fast0", "fast1", "fast2"], [])

    asyncio.run(scenario())


def test_dead_slow_failing_and_missing_targets_each_say_what_happened(meshd_factory: MeshdFactory) -> None:
    a, b = two(meshd_factory)
    doomed = subprocess.Popen([sys.executable, "-c", EXPERT, str(b.socket), "doomed"],
                              stdout=subprocess.PIPE, text=True)
    hung = subprocess.Popen([sys.executable, "-c", EXPERT, str(b.socket), "hung"],
                            stdout=subprocess.PIPE, text=True)
    try:
        async def scenario() -> None:
            async with Experts(a, b, fast=1, slow=1) as ex, Agent("boss", socket=a.socket) as boss, \
                    Agent("broken", socket=b.socket) as broken:
                @broken.on("ask")
                def fail(msg: Any) -> Any:
                    raise RuntimeError("no idea")

                await wait_listed(boss, "fast0", "slow0", "doomed", "hung", "broken")
                os.kill(doomed.pid, signal.SIGKILL)  # kill -9: its daemon removes it
                doomed.wait(10)
                await wait_listed(boss, "doomed", present=False)
                progress: list[tuple[str, str]] = []
                g = boss.gather("ask", None, to=["fast0", "slow0", "doomed", "hung", "broken", "nobody"],
                                timeout=2.5, on_progress=lambda t, n: progress.append((t, n)))
                got = [r.sender async for r in g]
                s = g.summary
                assert s is not None and got == ["fast0"]
                assert s.replied == ["fast0"] and s.errors == {"broken": "HANDLER_ERROR"}
                assert sorted(s.unreachable) == ["doomed", "nobody"]
                assert sorted(s.timed_out) == ["hung", "slow0"] and s.ended == "timeout"
                # the slow one's handler hears that the time is up (the client sends cancel)
                await async_wait_until(lambda: "slow0" in ex.cancelled)

        asyncio.run(scenario())
    finally:
        for p in (doomed, hung):
            p.kill()
            p.wait(10)


def test_killed_mid_gather_is_a_time_out_not_a_hang(meshd_factory: MeshdFactory) -> None:
    a, b = two(meshd_factory)
    victim = subprocess.Popen([sys.executable, "-c", EXPERT, str(b.socket), "victim"],
                              stdout=subprocess.PIPE, text=True)
    try:
        async def scenario() -> None:
            async with Experts(a, b, fast=1, slow=0), Agent("boss", socket=a.socket) as boss:
                await wait_listed(boss, "fast0", "victim")
                g = boss.gather("ask", None, capability="expert", timeout=3)
                first = await g.__anext__()
                assert first.sender == "fast0"
                assert victim.stdout is not None
                line = await asyncio.get_running_loop().run_in_executor(None, victim.stdout.readline)
                assert line.strip() == "started"
                os.kill(victim.pid, signal.SIGKILL)
                rest = [r async for r in g]
                assert rest == [] and g.summary is not None
                assert g.summary.timed_out == ["victim"] and g.summary.replied == ["fast0"]

        asyncio.run(scenario())
    finally:
        victim.kill()
        victim.wait(10)


def test_cancel_cancels_the_outstanding_requests(meshd_factory: MeshdFactory) -> None:
    a, b = two(meshd_factory)

    async def scenario() -> None:
        async with Experts(a, b, fast=0, slow=3) as ex, Agent("boss", socket=a.socket) as boss:
            await wait_listed(boss, "slow0", "slow1", "slow2")
            async with boss.gather("ask", None, capability="expert", timeout=20) as g:
                await async_wait_until(lambda: len(ex.started) == 3)
            assert g.summary is not None and g.summary.ended == "cancelled"
            assert sorted(g.summary.cancelled) == ["slow0", "slow1", "slow2"]
            await async_wait_until(lambda: sorted(ex.cancelled) == ["slow0", "slow1", "slow2"])
            # and cancelling the task that iterates does the same
            ex.started.clear()
            ex.cancelled.clear()
            g2 = boss.gather("ask", None, capability="expert", timeout=20)

            async def consume() -> None:
                async for _ in g2:
                    pass
            task = asyncio.ensure_future(consume())
            await async_wait_until(lambda: len(ex.started) == 3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert g2.summary is not None and g2.summary.ended == "cancelled"
            await async_wait_until(lambda: sorted(ex.cancelled) == ["slow0", "slow1", "slow2"])

    asyncio.run(scenario())


def test_subscribers_of_and_blocking_agent(meshd_factory: MeshdFactory) -> None:
    a, b = two(meshd_factory)

    async def scenario() -> None:
        async with Agent("w1", socket=a.socket) as w1, Agent("w2", socket=b.socket) as w2, \
                Agent("other", socket=b.socket) as other:
            for ag in (w1, w2, other):
                ag.on("ask")(lambda m, ag=ag: ag.name)
            await w1.subscribe("jobs.>")
            await w2.subscribe("jobs.render")
            await other.subscribe("news")

            def blocking() -> Any:
                with BlockingAgent("boss", socket=str(a.socket)) as boss:
                    return boss.gather("ask", None, subscribers_of="jobs.render", timeout=10)
            async with Agent("probe", socket=a.socket) as probe:
                async def subscribed() -> bool:
                    recs = {r["name"]: r for r in await probe.agents()}
                    return "jobs.render" in (recs.get("w2", {}).get("topics") or [])
                await async_wait_until(subscribed)
            replies, s = await asyncio.get_running_loop().run_in_executor(None, blocking)
            assert sorted(r.payload for r in replies) == ["w1", "w2"] and s.ended == "all"

    asyncio.run(scenario())


CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]


def test_meshctl_http_and_the_tool_gather_too(meshd_factory: MeshdFactory) -> None:
    a, b = two(meshd_factory)

    async def scenario() -> None:
        async with Experts(a, b, fast=3, slow=1) as ex, Agent("llm", socket=a.socket) as llm:
            await wait_listed(llm, "fast0", "fast1", "fast2", "slow0")
            # meshctl: a JSON line per reply, then the summary line
            loop = asyncio.get_running_loop()
            out = await loop.run_in_executor(None, lambda: subprocess.run(
                [*CTL, "--socket", str(a.socket), "gather", "ask", '{"q": 1}', "--capability", "expert",
                 "--want", "3", "--timeout", "10"], capture_output=True, text=True, timeout=30))
            assert out.returncode == 0, out.stderr
            lines = [json.loads(x) for x in out.stdout.splitlines()]
            assert sorted(x["from"] for x in lines[:-1]) == ["fast0", "fast1", "fast2"]
            assert lines[-1]["summary"]["ended"] == "want" and lines[-1]["summary"]["cancelled"] == ["slow0"]
            # the HTTP gateway
            gw = a.gateway()
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {gw.token}"}) as http:
                async with http.post(gw.url + "v1/agents/register", json={"name": "web"}) as r:
                    session = (await r.json())["session_id"]
                body = {"session_id": session, "topic": "ask", "payload": 2,
                        "to": ["fast1", "fast2", "ghost"], "timeout": 10}
                async with http.post(gw.url + "v1/gather", json=body) as r:
                    assert r.status == 200
                    got = await r.json()
                assert sorted(x["sender"] for x in got["replies"]) == ["fast1", "fast2"]
                assert got["summary"]["unreachable"] == ["ghost"] and got["summary"]["ended"] == "all"
                both = dict(body, capability="expert")
                async with http.post(gw.url + "v1/gather", json=both) as r:
                    assert r.status == 400  # exactly one way to name the targets
            # the tool, as an LLM calls it
            result = await llm.call_tool("gather_agents", {"topic": "ask", "payload": 3,
                                                           "capability": "expert", "want": 2})
            assert len(result["replies"]) == 2 and result["summary"]["ended"] == "want"
            assert {r["agent"] for r in result["replies"]} <= {"fast0", "fast1", "fast2"}
            # every slow handler that started (a cancel may also beat its request's start) hears it
            await async_wait_until(lambda: ex.running == 0
                                   and ex.cancelled.count("slow0") == ex.started.count("slow0") >= 1)

    asyncio.run(scenario())
