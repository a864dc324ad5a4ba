"""Contracts without sockets: the schema checker, version parsing, records, the typed topic."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from meshd.client.contracts import Contract, ContractRefused, TypedTopic, to_wire
from meshd.errors import HandlerError, SchemaVersionUnsupported, ValidationFailed, error_from_wire
from meshd.wire import protocol as P
from meshd.wire.contracts import check_records, parse_version, schema_errors


class Inner(BaseModel):
    n: int = Field(ge=0)


class Req(BaseModel):
    claim: str = Field(min_length=1, max_length=10)
    tags: list[str] = []
    inner: Inner | None = None
    mode: str = "fast"


def test_schema_checker_on_a_pydantic_schema() -> None:
    schema = Req.model_json_schema()
    assert schema_errors(schema, {"claim": "x"}) == []
    assert schema_errors(schema, {"claim": "x", "inner": {"n": 2}, "tags": ["a"], "extra": 1}) == []
    assert schema_errors(schema, {}) == [("claim", "field required")]
    assert schema_errors(schema, {"claim": ""})[0][0] == "claim"
    assert schema_errors(schema, {"claim": "x" * 11})[0][0] == "claim"
    assert schema_errors(schema, {"claim": "x", "tags": ["a", 3]})[0][0] == "tags.1"
    assert schema_errors(schema, {"claim": "x", "inner": {"n": -1}})[0][0] == "inner"  # anyOf
    assert schema_errors(schema, "a string")[0] == ("(payload)", "must be of type object, not str")
    assert schema_errors({"type": "integer"}, True) != []  # a bool is no integer
    assert schema_errors({"type": "object", "additionalProperties": False}, {"a": 1})[0][0] == "a"
    assert schema_errors({"enum": [1, 2]}, 3) != [] and schema_errors({"const": "a"}, "a") == []


def test_schema_checker_is_bounded_on_hostile_schemas() -> None:
    loop: dict[str, Any] = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
    assert schema_errors(loop, {}) == []  # a reference cycle ends at the depth bound
    assert len(schema_errors({"type": "array", "items": {"type": "string"}}, list(range(100)))) == 5


@pytest.mark.parametrize("text,parsed", [
    ("1.0", (1, 0)), ("12.345", (12, 345)), ("65535.65535", (65535, 65535)), ("1", None), ("1.2.3", None),
    ("a.b", None), ("65536.0", None), (" 1.0", None), (1.0, None), ("\uff11.\uff10", None)])
def test_versions(text: Any, parsed: Any) -> None:
    assert parse_version(text) == parsed
    if parsed is None:
        with pytest.raises(P.FrameError):
            P.header_from_map({P.KIND: "send", P.SCHEMA_VERSION: text})
    else:
        P.header_from_map({P.KIND: "send", P.SCHEMA_VERSION: text})


def test_records_are_checked() -> None:
    good = [{"topic": "verify", "version": "1.2", "accepts": {"type": "object"}, "description": "d"}]
    assert check_records(good) is None
    assert "two contracts" in str(check_records([*good, {"topic": "verify", "version": "1.9"}]))
    assert check_records([*good, {"topic": "verify", "version": "2.0"}]) is None
    assert "unknown keys" in str(check_records([{"topic": "t", "version": "1.0", "evil": 1}]))
    assert "version" in str(check_records([{"topic": "t", "version": "x"}]))
    assert "accepts" in str(check_records([{"topic": "t", "version": "1.0", "accepts": []}]))
    assert check_records("no") is not None and check_records([1]) is not None


class Msg:
    def __init__(self, payload: Any, version: str | None = None, is_request: bool = True) -> None:
        self.payload, self.schema_version, self.is_request = payload, version, is_request


def test_typed_topic_picks_validates_and_answers() -> None:
    seen: list[Any] = []
    topic = TypedTopic("verify", defer=object())
    topic.add(Contract("verify", (1, 2), lambda m: seen.append(m.payload) or {"ok": True}, Req,
                       {"type": "object", "required": ["ok"]}))
    topic.add(Contract("verify", (2, 0), lambda m: m.payload, {"type": "object", "required": ["s"]}))
    assert topic(Msg({"claim": "x"})) == {"ok": True} and isinstance(seen[0], Req)
    assert topic(Msg({"s": 1}, "2.5")) == {"s": 1}
    with pytest.raises(ContractRefused) as refused:
        topic(Msg({"claim": 3}, "1.0"))
    assert isinstance(refused.value.error, ValidationFailed)
    assert refused.value.error.details == {"field": "claim", "topic": "verify", "version": "1.2"}
    with pytest.raises(ContractRefused) as refused:
        topic(Msg({}, "7.0"))
    assert isinstance(refused.value.error, SchemaVersionUnsupported)
    assert refused.value.error.details["supported"] == ["1.2", "2.0"]
    assert len(seen) == 1  # no handler ran for either refusal
    bad = TypedTopic("t", defer=None)
    bad.add(Contract("t", (1, 0), lambda m: {"nope": 1}, None, {"type": "object", "required": ["ok"]}))
    with pytest.raises(HandlerError):
        bad(Msg({}))
    assert bad(Msg({}, is_request=False)) == {"nope": 1}  # a send's return value is no reply


def test_records_and_wire_shapes() -> None:
    rec = Contract("verify", (1, 2), print, Req, None, "Check", [Req(claim="a")]).record()
    assert rec["version"] == "1.2" and rec["examples"] == [{"claim": "a", "tags": [], "inner": None,
                                                            "mode": "fast"}]
    assert rec["accepts"]["required"] == ["claim"] and check_records([rec]) is None
    assert to_wire(Req(claim="a"))["claim"] == "a" and to_wire({"a": 1}) == {"a": 1}
    body = P.error_body("NACK", "busy", retry=True, retry_after=5, fallback="expert",
                        details={"field": "x", "other": 1})
    err = error_from_wire(body)
    assert (err.code, err.retry, err.retry_after, err.fallback) == ("NACK", True, 5.0, "expert")
    assert err.details == {"field": "x"}


def test_skill_tools_one_per_topic_and_major_bounded_and_filtered() -> None:
    from meshd.bindings.mcp_skills import SkillTools

    class FakeAgent:
        name = "llm"

    records = [
        {"name": "researcher", "contracts": [
            {"topic": "verify", "version": "1.2", "accepts": {"type": "object"}, "description": "Check"},
            {"topic": "verify", "version": "2.0", "accepts": {"type": "object"}},
            {"topic": "count", "version": "1.0", "accepts": {"type": "integer"}}]},
        {"name": "odd.name", "contracts": [{"topic": "a b", "version": "1.0"}]},
        {"name": "llm", "contracts": [{"topic": "self", "version": "1.0"}]},  # itself: not a tool
        {"name": "plain"},
    ]
    skills = SkillTools(FakeAgent(), max_tools=10).build(records)  # type: ignore[arg-type]
    assert set(skills) == {"researcher__verify", "researcher__verify__v1", "researcher__count",
                           "odd_name__a_b"}  # names every LLM API takes: [A-Za-z0-9_-]
    assert skills["researcher__verify"].version == "2.0" and skills["researcher__verify__v1"].version == "1.2"
    assert skills["researcher__count"].wrapped and skills["researcher__count"].payload({"payload": 3}) == 3
    assert not skills["researcher__verify"].wrapped
    bounded = SkillTools(FakeAgent(), max_tools=2)  # type: ignore[arg-type]
    assert len(bounded.build(records)) == 2 and bounded.left_out == 2
    only = SkillTools(FakeAgent(), allow=("odd.*",)).build(records)  # type: ignore[arg-type]
    assert set(only) == {"odd_name__a_b"}


def test_an_agents_refusal_notice_never_fails_a_pending_call() -> None:
    import asyncio

    from meshd.client import Agent
    from meshd.errors import MeshError

    async def scenario() -> None:
        agent = Agent("victim", socket="/nonexistent/s.sock")
        reported: list[tuple[MeshError, str | None]] = []
        agent.on_error = lambda err, msg_id: reported.append((err, msg_id))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        agent._pending["guessable-1"] = fut
        forged = P.error_header("victim", "guessable-1", "NACK", "go away", sender="mallory", notice=True)
        agent._incoming.on_error(forged)
        assert not fut.done() and reported and reported[0][0].code == "NACK"
        # the same from the agent's daemon is an answer: it fails the call
        real = P.error_header("victim", "guessable-1", "INBOX_FULL", "full", sender="meshd@n1", notice=True)
        agent._incoming.on_error(real)
        assert fut.done() and fut.exception().code == "INBOX_FULL"  # type: ignore[union-attr]

    asyncio.run(scenario())
