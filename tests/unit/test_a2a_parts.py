"""The A2A binding's pure parts: payload <-> parts, the documented error table, the trust rule,
which agents are served, and the task store's bound. No sockets."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

pytest.importorskip("a2a", reason="the 'a2a' extra is not installed")

from a2a.server.context import ServerCallContext
from a2a.types import Part, Task, TaskState, TaskStatus
from a2a.utils.errors import InternalError

from meshd.bindings.a2a.cards import CardMaker, exposed
from meshd.bindings.a2a.parts import ERROR_STATES, parts_from_payload, payload_from_parts, state_name
from meshd.bindings.a2a.remote import host_trusted, mesh_name
from meshd.bindings.a2a.store import BoundedTaskStore

DOC = Path(__file__).resolve().parents[2] / "docs" / "a2a.md"


def test_the_error_table_in_the_docs_is_the_code() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text[text.index("<!-- table:a2a-errors -->"):].split("\n\n")[0]
    rows = dict(re.findall(r"^\| `([A-Z_]+)` \| `(TASK_STATE_[A-Z_]+)` \|$", table, re.M))
    assert rows == {code: TaskState.Name(state) for code, state in ERROR_STATES.items()}


@pytest.mark.parametrize("payload", ["text", b"\x00\x01", {"a": 1, "b": [1, 2.5, None]}, [1, "x"], None, 7])
def test_a_payload_survives_parts(payload: object) -> None:
    assert payload_from_parts(parts_from_payload(payload)) == payload


def test_parts_become_a_payload() -> None:
    assert payload_from_parts([Part(text="hi")]) == "hi"
    both = payload_from_parts([Part(text="hi"), Part(url="http://x/y", media_type="image/png")])
    assert both == [{"text": "hi"}, {"url": "http://x/y", "media_type": "image/png"}]
    assert payload_from_parts([]) == []
    assert state_name(TaskState.TASK_STATE_INPUT_REQUIRED) == "input-required"


def test_trusted_hosts_and_names() -> None:
    assert host_trusted("https://agents.lan/.well-known/agent-card.json", ["agents.lan"])
    assert host_trusted("http://10.0.0.7:9000/card", ["10.0.0.7:9000"])
    assert not host_trusted("http://10.0.0.7:9001/card", ["10.0.0.7:9000"])
    assert host_trusted("https://agents.lan/x", ["agents.lan:443"])
    assert not host_trusted("https://agents.lan.evil/x", ["agents.lan"])
    assert not host_trusted("file:///etc/passwd", ["agents.lan"])
    assert not host_trusted("http://[::1]:80/x", ["127.0.0.1"])
    assert host_trusted("http://[::1]:80/x", ["[::1]"])
    assert mesh_name("Weather Bot") == "Weather-Bot" and mesh_name("???") == "a2a-agent"
    assert len(mesh_name("x" * 500)) == 128


def test_which_agents_are_served() -> None:
    assert exposed("expert", ["*"], set())
    assert not exposed("meshd.sys.abc", ["*"], set())
    assert not exposed("a2a", ["*"], {"a2a"})
    assert not exposed("with space", ["*"], set())  # not URL-safe: never a tenant
    assert exposed("team.alpha", ["team.*"], set()) and not exposed("other", ["team.*"], set())


def test_a_card_says_what_the_agent_is() -> None:
    card = CardMaker("http://127.0.0.1:1").card({"name": "x", "capabilities": ["a", "b"], "node_name": "n",
                                                  "metadata": {"description": "does x", "version": "2.1"}})
    assert (card.name, card.description, card.version) == ("x", "does x", "2.1")
    assert [s.id for s in card.skills] == ["a", "b"] and card.capabilities.streaming
    assert {i.tenant for i in card.supported_interfaces} == {"x"}
    assert "bearer" in card.security_schemes and "mtls" not in card.security_schemes


def _task(task_id: str, state: TaskState) -> Task:
    return Task(id=task_id, context_id="c", status=TaskStatus(state=state))


def test_the_task_store_forgets_finished_tasks_and_refuses_when_all_run() -> None:
    async def scenario() -> None:
        store = BoundedTaskStore(2)
        ctx, other = ServerCallContext(tenant="a"), ServerCallContext(tenant="b")
        await store.save(_task("t1", TaskState.TASK_STATE_COMPLETED), ctx)
        await store.save(_task("t2", TaskState.TASK_STATE_WORKING), other)
        assert await store.get("t2", ctx) is None  # scoped by agent
        await store.save(_task("t3", TaskState.TASK_STATE_WORKING), ctx)  # t1, finished, is forgotten
        assert await store.get("t1", ctx) is None and store.evicted == 1
        with pytest.raises(InternalError, match="TASK_STORE_FULL"):
            await store.make_room()
        await store.save(_task("t3", TaskState.TASK_STATE_COMPLETED), ctx)  # an update takes no room
        assert len(store) == 2 and store.refused == 1
        await store.make_room()
        assert len(store) == 1

    asyncio.run(scenario())
