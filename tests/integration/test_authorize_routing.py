"""meshd_authorize on the routing path, in a real daemon: an agent's own send, request and publish
(single and batched, qos 0 and 1) are allowed or refused with FORBIDDEN, the refusal reaches
observers as a ``forbidden`` event, and a decision is cached (the hook is asked once)."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent
from meshd.errors import Forbidden, MeshError
from meshd.testing import MeshdFactory, async_wait_until, wait_listed, wait_until

PLUGIN = '''
import json, os
from meshd.hookspecs import hookimpl

@hookimpl
def meshd_authorize(action, subject, target, topic):
    with open(os.environ["AUTHZ_CALLS"], "a") as fh:
        fh.write(json.dumps([action, subject, target, topic]) + "\\n")
    if action == "message" and target == "vault":
        return "the vault takes no messages"
    if action == "message" and target == "*" and topic == "secret":
        return False
    return None

@hookimpl
def meshd_tool_event(event):
    with open(os.environ["AUTHZ_EVENTS"], "a") as fh:
        fh.write(json.dumps(event) + "\\n")
'''


def _lines(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_messages_allowed_refused_and_cached(meshd_factory: MeshdFactory, tmp_path: Path) -> None:
    (tmp_path / "authz_route.py").write_text(textwrap.dedent(PLUGIN))
    (tmp_path / "meshd.toml").write_text('plugins = ["authz_route"]\n')
    calls, events = tmp_path / "calls.jsonl", tmp_path / "events.jsonl"
    a = meshd_factory.spawn("a", "--config", str(tmp_path / "meshd.toml"),
                            env={"PYTHONPATH": str(tmp_path), "AUTHZ_CALLS": str(calls),
                                 "AUTHZ_EVENTS": str(events)})

    async def scenario() -> None:
        async with Agent("alice", socket=a.socket) as alice, Agent("bob", socket=a.socket) as bob, \
                Agent("vault", socket=a.socket) as vault:
            vault_got: list[Any] = []
            errors: list[MeshError] = []
            alice.on_error = lambda err, _id: errors.append(err)

            @bob.on("ask")
            async def ask(msg: Any) -> Any:
                return msg.payload + 1

            @vault.on("*")
            async def take(msg: Any) -> Any:
                vault_got.append(msg.payload)
                return "opened"

            await bob.subscribe("news")
            await bob.subscribe("secret")
            await wait_listed(alice, "vault")
            # allowed: the hook is asked once, then the cached answer serves
            assert await alice.request("bob", "ask", 1) == 2
            assert await alice.request("bob", "ask", 2) == 3
            assert await alice.publish("news", "hi", reach=True) == 1
            # refused, with the hook's reason, for request, qos-1 send, qos-0 send and publish
            with pytest.raises(Forbidden, match="the vault takes no messages"):
                await alice.request("vault", "open", 1)
            with pytest.raises(Forbidden, match="vault"):
                await alice.send("vault", "t", 2, qos=1)
            await alice.send("vault", "t", 3)
            await async_wait_until(lambda: any(e.code == "FORBIDDEN" for e in errors), 10,
                                   what="the qos-0 send's FORBIDDEN error")
            with pytest.raises(Forbidden, match="publish on 'secret'"):
                await alice.publish("secret", "x", reach=True)
            # a batch (sends queued in one loop turn) is refused message by message
            results = await asyncio.gather(*(alice.send("vault", "b", i, qos=1) for i in range(20)),
                                           return_exceptions=True)
            assert all(isinstance(r, Forbidden) for r in results), results
            # the daemon goes on; nothing reached the vault
            assert await alice.request("bob", "ask", 3) == 4
            assert vault_got == []

    asyncio.run(scenario())
    asked = [tuple(c) for c in _lines(calls)]
    assert asked.count(("message", "alice", "bob", "ask")) == 1  # cached
    assert ("message", "alice", "*", "news") in asked
    wait_until(lambda: len([e for e in _lines(events) if e.get("action") == "message"]) >= 4,
               what="forbidden events for observers")
    refused = [e for e in _lines(events) if e.get("action") == "message"]
    assert all(e["event"] == "forbidden" and e["caller"] == "alice" for e in refused)
    assert {(e["target"], e["topic"]) for e in refused} >= {("vault", "open"), ("vault", "t"),
                                                            ("*", "secret")}
    assert a.alive()
