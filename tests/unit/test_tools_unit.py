"""The tool layer without sockets: registry and schemas, validation, approval policy and held calls,
quotas, the cached authorizer, the plugin host's tool hooks, and NOT_WIRED task/spawn tools."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel, Field

from meshd.config.settings import Settings, ToolsSettings
from meshd.errors import (
    ApprovalDenied,
    ConfigError,
    Forbidden,
    NoSuchApproval,
    NoSuchTool,
    NotWired,
    QueueFull,
    QuotaExceeded,
    ValidationFailed,
    error_from_wire,
)
from meshd.hookspecs import hookimpl
from meshd.plugins.host import PluginHost
from meshd.plugins.policy import Approvals, Authorizer, Quotas, parse_decision
from meshd.tools import Tool, ToolContext, ToolRegistry
from meshd.tools import builtin as B
from meshd.tools.registry import schema_as, validate_args


class DiceArgs(BaseModel):
    sides: int = Field(ge=2, description="Sides of the die.")
    count: int = 1


async def roll(args: DiceArgs, ctx: ToolContext) -> list[int]:
    return [args.sides] * args.count


def dice(name: str = "dice") -> Tool:
    return Tool(name, "Roll dice.", DiceArgs, roll)


def test_tool_checks_its_fields() -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        Tool("no spaces", "x", DiceArgs, roll)
    with pytest.raises(TypeError, match="pydantic model"):
        Tool("ok", "x", dict, roll)  # type: ignore[arg-type]
    assert dice().input_schema()["required"] == ["sides"]


def test_schema_shapes() -> None:
    reg = ToolRegistry()
    reg.add(dice(), "p")
    (desc,) = reg.describe()
    assert desc["plugin"] == "p" and desc["side_effects"] is False
    assert schema_as(desc, "openai") == {"type": "function", "function": {
        "name": "dice", "description": "Roll dice.", "parameters": desc["input_schema"]}}
    assert schema_as(desc, "anthropic") == {"name": "dice", "description": "Roll dice.",
                                            "input_schema": desc["input_schema"]}
    assert schema_as(desc, "mcp")["inputSchema"]["properties"]["sides"]["minimum"] == 2
    with pytest.raises(ValidationFailed):
        reg.schemas("gemini")
    with pytest.raises(NoSuchTool, match="dice"):
        reg.get("dice2")


def test_duplicate_tool_name_names_both_plugins() -> None:
    class First:
        @hookimpl
        def meshd_tools(self) -> list[Tool]:
            return [dice()]

    class Second:
        @hookimpl
        def meshd_tools(self) -> list[Tool]:
            return [dice(), dice("other")]

    host = PluginHost(load_entrypoints=False, environ={})
    host.register(First(), name="first")
    host.register(Second(), name="second")
    reg = ToolRegistry()
    with pytest.raises(ConfigError, match="'dice' is contributed by two plugins") as info:
        for plugin, tool in host.contributed_tools():
            reg.add(tool, plugin)
    assert "'first'" in info.value.message and "'second'" in info.value.message


def test_a_raising_tools_plugin_is_left_out() -> None:
    class Broken:
        @hookimpl
        def meshd_tools(self) -> list[Tool]:
            raise RuntimeError("boom")

    class Good:
        @hookimpl
        def meshd_tools(self) -> list[Tool]:
            return [dice()]

    host = PluginHost(load_entrypoints=False, environ={})
    host.register(Broken(), name="broken")
    host.register(Good(), name="good")
    assert [(p, t.name) for p, t in host.contributed_tools()] == [("good", "dice")]
    assert host.stats["failed:broken"] == 1


def test_validation_names_the_field() -> None:
    with pytest.raises(ValidationFailed, match="field 'sides'") as info:
        validate_args(dice(), {"sides": 1})
    assert info.value.details == {"field": "sides"}
    with pytest.raises(ValidationFailed, match="must be an object"):
        validate_args(dice(), [1])
    plan = next(t for t in B.builtin_tools() if t.name == "create_plan")
    with pytest.raises(ValidationFailed, match=r"field 'tasks\.0\.capability'"):
        validate_args(plan, {"tasks": [{"id": "a", "title": "t"}]})
    assert validate_args(dice(), {"sides": 6}).model_dump() == {"sides": 6, "count": 1}


def test_tool_errors_round_trip_the_wire() -> None:
    from meshd.wire.protocol import error_body

    for cls in (NoSuchTool, ApprovalDenied, Forbidden, QuotaExceeded, NotWired, NoSuchApproval, QueueFull):
        err = error_from_wire(error_body(cls.code, "why"))
        assert type(err) is cls and err.message == "why"


def test_approval_decisions() -> None:
    assert parse_decision(None) is None
    assert parse_decision("allow") == ("allow", "")
    assert parse_decision("hold") == ("hold", "")
    assert parse_decision("deny: too costly") == ("deny", "too costly")
    assert parse_decision(False)[0] == "deny"
    assert parse_decision(42)[0] == "deny"  # a broken policy does not let calls through
    approvals = Approvals(ToolsSettings(default_approval="hold", approval={"publish": "deny", "x": "allow"}))
    assert approvals.policy("x", None) == ("allow", "")
    assert approvals.policy("other", None) == ("hold", "")
    assert approvals.policy("publish", None)[0] == "deny"
    assert approvals.policy("publish", "allow") == ("allow", "")  # the plugin's answer wins


def test_held_calls() -> None:
    async def scenario() -> None:
        approvals = Approvals(ToolsSettings(max_held=2))
        first = approvals.hold("spawn_agent", "llm", {"template": "w"})
        approvals.hold("spawn_agent", "llm", {})
        with pytest.raises(QueueFull):
            approvals.hold("spawn_agent", "llm", {})
        assert approvals.list()[0]["id"] == first.id
        with pytest.raises(Forbidden):
            approvals.decide(first.id, True, "llm")
        with pytest.raises(NoSuchApproval):
            approvals.decide("nope", True, "ops")
        waiter = asyncio.ensure_future(approvals.wait(first, 5))
        assert approvals.decide(first.id, False, "ops", "no")["decision"] == "deny"
        with pytest.raises(ApprovalDenied, match="denied by ops: no"):
            await waiter
        second = next(iter(approvals.held.values()))
        with pytest.raises(ApprovalDenied, match="no decision"):
            await approvals.wait(second, 0.01)
        assert approvals.held == {}
        with pytest.raises(NoSuchApproval):
            approvals.decide(second.id, True, "ops")

    asyncio.run(scenario())


def test_call_quota_window() -> None:
    quotas = Quotas(ToolsSettings(calls_per_minute=2), max_agents=2)
    quotas.count_call("a", 0.0)
    quotas.count_call("a", 10.0)
    with pytest.raises(QuotaExceeded) as info:
        quotas.count_call("a", 30.0)
    assert info.value.retry_after == 30.0
    quotas.count_call("a", 60.5)  # the first call left the window
    quotas.count_call("b", 0.0)
    quotas.count_call("c", 0.0)
    assert len(quotas._calls) == 2  # bounded: the longest-idle agent is forgotten


def test_task_and_spawn_quotas() -> None:
    quotas = Quotas(ToolsSettings(max_concurrent_tasks=2, max_spawned=1))
    quotas.add_tasks("a", ["t1", "t2"])
    with pytest.raises(QuotaExceeded, match="max_concurrent_tasks"):
        quotas.check_tasks("a", 1, lambda t: True)
    quotas.check_tasks("a", 1, lambda t: t != "t1")  # t1 finished
    quotas.add_spawn("a", "w1")
    with pytest.raises(QuotaExceeded, match="max_spawned"):
        quotas.check_spawn("a", lambda name: True)
    quotas.check_spawn("a", lambda name: False)


def test_authorizer_caches_and_explains() -> None:
    calls: list[tuple[Any, ...]] = []

    def ask(action: str, subject: str, target: str, topic: str | None) -> Any:
        calls.append((action, subject, target, topic))
        return {"spawn_agent": "planners only", "publish": False}.get(target)

    auth = Authorizer(ask, capacity=2)
    assert auth.check("tool", "llm", "list_agents") is None
    assert auth.check("tool", "llm", "list_agents") is None
    assert len(calls) == 1
    assert auth.check("tool", "llm", "spawn_agent") == "planners only"
    with pytest.raises(Forbidden, match="may not call tool 'publish'"):
        auth.require("tool", "llm", "publish")
    assert len(auth._cache) == 2
    assert Authorizer(None).check("tool", "x", "y") is None


def test_plugin_host_fails_closed() -> None:
    class Raises:
        @hookimpl
        def meshd_approve_tool(self, call: dict[str, Any]) -> Any:
            raise RuntimeError("boom")

        @hookimpl
        def meshd_authorize(self, action: str) -> Any:
            raise RuntimeError("boom")

    host = PluginHost(load_entrypoints=False, environ={})
    assert not host.wants_authorize()
    host.register(Raises(), name="raises")
    assert host.wants_authorize()
    assert asyncio.run(host.approve_tool({"tool": "t"})).startswith("deny:")
    assert "failed" in host.authorize("tool", "a", "t", None)


@pytest.mark.parametrize("tool,args", [
    ("create_task", {"title": "t", "capability": "c"}),
    ("create_plan", {"tasks": [{"id": "a", "title": "t", "capability": "c"}]}),
    ("task_status", {"task_id": "x"}),
    ("wait_task", {"task_id": "x"}),
    ("list_tasks", {}),
    ("cancel_task", {"task_id": "x"}),
    ("spawn_agent", {"template": "w"}),
])
def test_unwired_tools_fail_loudly(tool: str, args: dict[str, Any]) -> None:
    t = next(t for t in B.builtin_tools() if t.name == tool)
    ctx = ToolContext(caller="llm", agent=None, settings=Settings())  # type: ignore[arg-type]
    with pytest.raises(NotWired, match="nothing was"):
        asyncio.run(t.handler(validate_args(t, args), ctx))
