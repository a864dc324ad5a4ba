"""Nothing may depend on hosts agreeing on the time (edge hosts often have no NTP and no RTC).

Two real daemons on 127.0.0.1; daemon b and its agent run under libfaketime with the wall clock
an hour behind or ahead (the monotonic clock untouched, as on a host without NTP). Requests,
delegations, qos-1 sends and name conflicts behave as with synced clocks; a jump of b's wall
clock while it runs marks no peer stale, expires nothing and reorders nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshd import DEFER, Agent, Message, RequestTimeout
from meshd.testing import (
    MeshdFactory,
    MeshdProcess,
    async_wait_until,
    faketime_env,
    libfaketime,
    wait_listed,
    wait_until,
)

pytestmark = pytest.mark.skipif(libfaketime() is None,
                                reason="libfaketime (Debian package 'faketime') is not installed")

HERE = Path(__file__).parent
OFFSETS = ["-1h", "+1h"]


class SkewedAgent:
    """clock_agents.py as a subprocess under the same fake clock as its daemon."""

    def __init__(self, daemon: MeshdProcess, name: str, env: dict[str, str]) -> None:
        self.ready = daemon.dir / f"{name}.ready"
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "clock_agents.py"), "--socket", str(daemon.socket),
             "--name", name, "--ready", str(self.ready)],
            env={**os.environ, **env}, stdin=subprocess.DEVNULL)
        wait_until(lambda: self.ready.exists() or self.proc.poll() is not None, 15,
                   what=f"agent {name} to register")
        assert self.proc.poll() is None, f"agent {name} exited with {self.proc.returncode}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def skewed_agents() -> Iterator[list[SkewedAgent]]:
    agents: list[SkewedAgent] = []
    yield agents
    for agent in agents:
        agent.stop()


def meshctl(daemon: MeshdProcess, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """meshctl on b's host: under b's fake clock, as a user on that host would run it."""
    ctl = "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"
    return subprocess.run([sys.executable, "-c", ctl, "--socket", str(daemon.socket), *args],
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


def test_the_fake_clock_is_in_force(tmp_path: Path) -> None:
    """The harness itself: the child's wall clock is an hour off, its monotonic clock is not."""
    code = "import time, json; print(json.dumps([time.time(), time.monotonic()]))"
    t0, m0 = time.time(), time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **faketime_env("-1h")},
                         capture_output=True, text=True, timeout=30, check=True).stdout
    wall, mono = json.loads(out)
    assert 3500 < t0 - wall < 3700
    assert abs(mono - m0) < 60


@pytest.mark.parametrize("offset", OFFSETS)
def test_requests_and_delegations_across_an_hour_of_skew(meshd_factory: MeshdFactory, offset: str,
                                                         skewed_agents: list[SkewedAgent]) -> None:
    env = faketime_env(offset)
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b", env=env)
    meshd_factory.wait_mesh([a, b])
    skewed_agents.append(SkewedAgent(b, "echo-b", env))

    async def scenario() -> None:
        async with Agent("echo-a", socket=a.socket) as echo_a:
            @echo_a.on("echo")
            async def echo(msg: Message) -> Any:
                return {"left": msg.time_left, "payload": msg.payload}

            await wait_listed(echo_a, "echo-a", "echo-b")
            # a (true clock) -> b (skewed): the handler is told at most the 5 s it was given.
            reply = await echo_a.request("echo-b", "echo", {"x": 1}, timeout=5)
            assert reply["payload"] == {"x": 1} and 0 < reply["left"] <= 5.0, reply
            # b (skewed) -> a, asked from b's host: the direction that once failed at once (TIMEOUT).
            answer = await echo_a.request("echo-b", "ask", {"to": "echo-a", "topic": "echo",
                                                             "timeout": 5, "payload": "hi"}, timeout=10)
            assert "error" not in answer, answer
            assert answer["reply"]["payload"] == "hi" and 0 < answer["reply"]["left"] <= 5.0
            # A delegation through the skewed host passes on only what is left.
            delegated = await echo_a.request("echo-b", "delegate", {"to": "echo-a"}, timeout=4)
            assert 0 < delegated["left"] <= 4.0, delegated
            # And delegated from the true-clock host to the skewed one and back.
            async with Agent("router-a", socket=a.socket) as router_a:
                @router_a.on("delegate")
                async def pass_on(msg: Message) -> Any:
                    await router_a.delegate(msg, "echo-b", topic="echo")
                    return DEFER

                await wait_listed(echo_a, "router-a")
                async with Agent("probe-b", socket=b.socket) as probe_b:  # echo-b's daemon knows it
                    await wait_listed(probe_b, "router-a")  # (else echo-b's ask fails: NO_SUCH_AGENT)
                answer = await echo_a.request("echo-b", "ask", {"to": "router-a", "topic": "delegate",
                                                                 "timeout": 3}, timeout=10)
                assert "error" not in answer and 0 < answer["reply"]["left"] <= 3.0, answer

    asyncio.run(scenario())

    # The first report: meshctl request from the host whose clock is off, to an agent on a.
    async def serve_and_ask() -> subprocess.CompletedProcess[str]:
        async with Agent("echo-a2", socket=a.socket) as echo_a2:
            @echo_a2.on("echo")
            async def echo2(msg: Message) -> Any:
                return {"left": msg.time_left}

            await async_wait_until(lambda: "echo-a2" in {x["name"] for x in b.query("agents")},
                                   what="echo-a2 listed on b")
            return await asyncio.to_thread(meshctl, b, env, "request", "echo-a2", "echo", "{}",
                                           "--timeout", "5")
    done = asyncio.run(serve_and_ask())
    assert done.returncode == 0, done.stderr
    assert 0 < json.loads(done.stdout)["left"] <= 5.0


@pytest.mark.parametrize("offset", OFFSETS)
def test_a_budget_is_enforced_on_the_requesters_clock(meshd_factory: MeshdFactory, offset: str,
                                                      skewed_agents: list[SkewedAgent]) -> None:
    """A handler that never answers: the call ends with TIMEOUT after its budget, not an hour
    early or late; the skewed handler was told no more than the budget."""
    env = faketime_env(offset)
    a = meshd_factory.spawn("a")
    b = meshd_factory.spawn("b", env=env)
    meshd_factory.wait_mesh([a, b])
    skewed_agents.append(SkewedAgent(b, "echo-b", env))
    seen: list[float | None] = []

    async def scenario() -> None:
        async with Agent("sink-a", socket=a.socket) as sink_a:
            @sink_a.on("hold")
            async def hold(msg: Message) -> Any:
                seen.append(msg.time_left)
                return DEFER  # never answered

            await wait_listed(sink_a, "sink-a", "echo-b")
            async with Agent("probe-b", socket=b.socket) as probe_b:  # echo-b's daemon knows sink-a
                await wait_listed(probe_b, "sink-a")  # (else echo-b's ask fails fast: NO_SUCH_AGENT)
            for budget in (0.3, 1.0):
                answer = await sink_a.request("echo-b", "ask", {"to": "sink-a", "topic": "hold",
                                                                 "timeout": budget}, timeout=10)
                assert answer == {"error": "TIMEOUT"}, answer
            # From the true-clock side to the skewed side: measured on this (requester's) clock.
            for budget in (0.3, 1.0):
                t0 = time.monotonic()
                try:
                    answer = await sink_a.request("echo-b", "ask", {"to": "sink-a", "topic": "hold",
                                                                     "timeout": 60}, timeout=budget)
                except RequestTimeout:
                    answer = None
                # echo-b's own ask runs out of the same budget (it holds the rest of it, counted from
                # when its request arrived), so its TIMEOUT answer may win the race by a hair.
                assert answer in (None, {"error": "TIMEOUT"}), answer
                late = time.monotonic() - t0 - budget
                assert late >= 0  # never gives up early
                print(f"offset={offset} budget={budget:g}s timeout_after_budget={late * 1000:.1f}ms")

    asyncio.run(scenario())
    assert len(seen) == 4 and all(left is not None and 0 < left <= 60.0 for left in seen), seen
    assert all(left is not None and left <= 1.0 for left in seen[:2]), seen


@pytest.mark.parametrize("offset", OFFSETS)
def test_qos1_sends_both_ways_across_an_hour_of_skew(meshd_factory: MeshdFactory, offset: str,
                                                     skewed_agents: list[SkewedAgent]) -> None:
    env = faketime_env(offset)
    qos_env = {"MESHD_QOS1_TTL": "30"}  # an hour of skew would expire every unit on the wall clock
    a = meshd_factory.spawn("a", env=qos_env)
    b = meshd_factory.spawn("b", env={**env, **qos_env})
    meshd_factory.wait_mesh([a, b])
    skewed_agents.append(SkewedAgent(b, "echo-b", env))
    count = 20

    async def scenario() -> None:
        got: list[int] = []
        async with Agent("sink-a", socket=a.socket) as sink_a:
            @sink_a.on("note-back")
            def back(msg: Message) -> None:
                got.append(int(msg.payload["n"]))

            await wait_listed(sink_a, "sink-a", "echo-b")
            for n in range(count):  # a -> b with qos 1; b's agent answers each with a qos-1 send
                await sink_a.send("echo-b", "note", {"n": n, "back": "sink-a"}, qos=1)
            await async_wait_until(lambda: len(got) >= count, 20, what="every qos-1 send back from b")
            assert got == list(range(count))  # all, once each, in order
    asyncio.run(scenario())
    for daemon in (a, b):
        assert not [d for d in daemon.dead_letters() if "qos1_ttl" in str(d)], daemon.dead_letters()


def _stays_online(procs: list[MeshdProcess], seconds: float) -> None:
    """Every daemon sees every other online at every look for ``seconds`` (longer than
    offline_after, so a peer wrongly aged by a clock jump would have shown up stale or offline)."""
    ids = {p.node_id for p in procs}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for p in procs:
            states = p.peer_states()
            assert all(states.get(n) == "online" for n in ids - {p.node_id}), (p.name, states)
        time.sleep(0.1)


def test_a_wall_clock_jump_on_a_running_daemon_changes_nothing(meshd_factory: MeshdFactory,
                                                               tmp_path: Path) -> None:
    offset_file = tmp_path / "offset"
    offset_file.write_text("+0\n")
    env = faketime_env(offset_file=offset_file)  # re-read on every clock call: jumps at run time
    qos_env = {"MESHD_QOS1_TTL": "30"}
    a = meshd_factory.spawn("a", env=qos_env)
    b = meshd_factory.spawn("b", env={**env, **qos_env})
    meshd_factory.wait_mesh([a, b])

    async def scenario() -> None:
        async with Agent("held-b", socket=b.socket) as held_b, Agent("req-a", socket=a.socket) as req_a:
            started, release = asyncio.Event(), asyncio.Event()

            @held_b.on("hold")
            async def hold(msg: Message) -> Any:
                started.set()
                await release.wait()
                return {"left": msg.time_left}

            await wait_listed(req_a, "held-b")
            call = asyncio.create_task(req_a.request("held-b", "hold", None, timeout=30))
            await started.wait()  # a request in flight through b
            for n in range(3):  # qos-1 units waiting in b's outbox (TTL 30 s) for an absent agent
                await held_b.send("late-a", "note", {"n": n}, qos=1)
            for jump in ("+1h", "-1h", "+0"):
                offset_file.write_text(f"{jump}\n")
                await asyncio.to_thread(_stays_online, [a, b], 2.5)
            release.set()
            reply = await call
            assert 0 < reply["left"] <= 30.0, reply
            got: list[int] = []
            async with Agent("late-a", socket=a.socket) as late:
                @late.on("note")
                def note(msg: Message) -> None:
                    got.append(int(msg.payload["n"]))

                await async_wait_until(lambda: len(got) >= 3, 20, what="the waiting qos-1 sends")
            assert got == [0, 1, 2]  # none expired by the jumps, none reordered

    asyncio.run(scenario())
    assert not [d for d in b.dead_letters() if "qos1_ttl" in str(d)], b.dead_letters()
