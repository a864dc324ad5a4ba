"""Dead letters (bounded twice) and collaboration outcomes, without a daemon."""

from __future__ import annotations

from typing import Any

from meshd.delivery.dead_letters import DeadLetters
from meshd.delivery.outcomes import Outcomes
from meshd.wire import protocol as P
from meshd.wire.protocol import Kind


def test_dead_letters_are_bounded_by_count_and_bytes() -> None:
    d = DeadLetters(capacity=3, max_bytes=4000)  # a letter costs its frames + 48 per frame + 1 KiB
    for i in range(5):
        d.add("r", f"detail {i}", [b"x" * 10], {P.ID: str(i)})
    assert [x["seq"] for x in d.list()] == [3, 4, 5] and d.total == 5 and d.evicted == 2
    d.add("big", "", [b"y" * 1500])
    d.add("big", "", [b"y" * 1500])
    assert [x["seq"] for x in d.list()] == [7] and d.get(7) is not None
    assert d.pop(7) is not None and d.list() == [] and d.purge() == 0


class FakePlugins:
    """A plugin host with one observer of meshd_collaboration."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def wants(self, hook: str) -> bool:
        return hook == "meshd_collaboration"

    def collaboration(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def _header(**fields: Any) -> P.Header:
    return P.header_from_map(fields)


def test_request_outcome_timed_from_send_to_reply() -> None:
    plugins = FakePlugins()
    out = Outcomes(plugins)  # type: ignore[arg-type]
    out.follow_plugins()
    req = _header(kind=Kind.REQUEST, id="r1", **{"from": "planner"}, to="researcher", topic="ask")
    assert out.outgoing(req, []) == []
    assert ("planner", "r1") in out.inflight
    out.answer("planner", _header(kind=Kind.REPLY, id="x", corr="r1"), [])
    [event] = plugins.events
    assert event["kind"] == "request" and event["outcome"] == "ok" and event["target"] == "researcher"
    assert event["latency_ms"] is not None and not out.inflight


def test_send_outcome_reports_the_routing_error_and_handoff_rejection() -> None:
    plugins = FakePlugins()
    out = Outcomes(plugins)  # type: ignore[arg-type]
    out.follow_plugins()
    send = _header(kind=Kind.SEND, id="s1", **{"from": "a"}, to="b", topic="t")
    out.sends_routed(out.outgoing(send, []), P.ErrorCode.NO_SUCH_AGENT)
    assert plugins.events[-1]["outcome"] == "error" and plugins.events[-1]["error_code"] == "NO_SUCH_AGENT"
    handoff = _header(kind=Kind.REQUEST, id="h1", **{"from": "a"}, to="b", topic=P.HANDOFF_TOPIC)
    out.outgoing(handoff, [])
    out.answer("a", _header(kind=Kind.REPLY, id="y", corr="h1", status="rejected"), [])
    assert plugins.events[-1]["kind"] == "handoff" and plugins.events[-1]["outcome"] == "rejected"


def test_unanswered_request_times_out_and_delegation_is_reported_once() -> None:
    plugins = FakePlugins()
    out = Outcomes(plugins)  # type: ignore[arg-type]
    out.follow_plugins()
    out.outgoing(_header(kind=Kind.REQUEST, id="r1", **{"from": "a"}, to="b", deadline=0.0), [])
    out.expire()
    assert plugins.events[-1]["outcome"] == "error" and plugins.events[-1]["error_code"] == "TIMEOUT"
    out.outgoing(_header(kind=Kind.REQUEST, id="d1", **{"from": "a"}, to="c", origin="z", corr="r0"), [])
    assert plugins.events[-1]["kind"] == "delegate" and not out.inflight
    out.delivered("u1", "a", "b", "t", created=0.0)
    assert plugins.events[-1]["outcome"] == "delivered" and plugins.events[-1]["qos"] == 1


def test_without_observers_outcomes_are_counted_and_a_batch_of_sends_is_not_opened() -> None:
    """No plugin observes: no event, but the tally counts; a batch that declares only sends is
    counted from its header's ``count`` (its body here is not even a valid batch)."""
    plugins = FakePlugins()
    plugins.wants = lambda hook: False  # type: ignore[method-assign]
    out = Outcomes(plugins)  # type: ignore[arg-type]
    out.follow_plugins()
    batch = _header(kind=Kind.BATCH, id="b1", **{"from": "a"}, to="b", count=51, kinds=["send"])
    out.sends_routed(out.outgoing(batch, [P.SIGNATURE, b"", b"not a batch"]), None)
    out.sends_routed(out.outgoing(batch, [P.SIGNATURE, b"", b"not a batch"]), "NO_SUCH_AGENT")
    assert plugins.events == []
    assert out.tally.counts[("send", "sent")] == 51 and out.tally.counts[("send", "error")] == 51
    assert out.tally.errors[("send", "NO_SUCH_AGENT")] == 51
