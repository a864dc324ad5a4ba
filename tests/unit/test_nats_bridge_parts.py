"""The pure parts of ``meshd bridge``: what crosses (hostile input refused at the edge) and the
other sites' directory (bounded, expiring, plain names only when unambiguous)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshd.bindings.nats import envelope as E
from meshd.bindings.nats.directory import ProxyName, RemoteDirectory
from meshd.errors import ValidationFailed
from meshd.wire import protocol as P

LIMIT = 64 * 1024


def test_a_crossing_round_trips() -> None:
    c = E.Crossing("request", "id1", "planner:a", "researcher", "verify", {"x": [1, 2]}, 1500, 2, 0,
                   {"traceparent": "00-x"}, "1.0")
    assert E.unpack_crossing(c.pack(), LIMIT) == c


@pytest.mark.parametrize("change", [
    {"k": "handoff"}, {"i": ""}, {"i": "x" * 200}, {"f": "has space"}, {"f": 7}, {"t": "a@b"},
    {"o": ""}, {"o": 3}, {"h": -1}, {"h": 256}, {"h": True}, {"q": 2}, {"b": -5}, {"b": 10**12},
    {"b": 1.5}, {"hd": []}, {"sv": 1},
])
def test_a_bad_field_is_refused(change: dict[str, Any]) -> None:
    good = {"k": "send", "i": "id", "f": "p:a", "t": "r", "o": "t", "p": None, "h": 0, "q": 0}
    with pytest.raises(ValidationFailed):
        E.unpack_crossing(P.pack(good | change), LIMIT)


@given(st.binary(max_size=300))
def test_any_bytes_are_a_crossing_or_a_typed_refusal(data: bytes) -> None:
    try:
        E.unpack_crossing(data, LIMIT)
    except ValidationFailed:
        pass


def test_too_large_is_refused_before_decoding() -> None:
    with pytest.raises(ValidationFailed, match="allowed"):
        E.unpack_crossing(b"\x80" * (LIMIT + 1), LIMIT)


def test_answers_round_trip_and_unknown_ones_are_refused() -> None:
    assert E.unpack_answer(E.answer(E.ANSWER_PROGRESS, "half"), LIMIT) == ("p", "half")
    assert E.unpack_answer(E.answer(E.ANSWER_REPLY, {"a": 1}), LIMIT) == ("r", {"a": 1})
    err = P.error_body("TIMEOUT", "late")
    assert E.unpack_answer(E.answer(E.ANSWER_ERROR, err), LIMIT) == ("e", err)
    with pytest.raises(ValidationFailed):
        E.unpack_answer(P.pack({"k": "e", "e": "not a map"}), LIMIT)


def test_cancels_name_one_request() -> None:
    assert E.unpack_cancel(E.cancel("abc")) == "abc"
    with pytest.raises(ValidationFailed):
        E.unpack_cancel(P.pack({"i": 3}))


def test_announcements_keep_only_well_formed_entries_within_bounds() -> None:
    data = E.announcement("b", [{"name": "ok", "capabilities": ["x", 3], "topics": ["t", ""],
                                 "contracts": [{"topic": "v"}, "junk"]},
                                {"name": "bad name"}, "junk"])  # type: ignore[list-item]
    site, agents = E.unpack_announcement(data, LIMIT)
    assert site == "b"
    assert agents == [{"name": "ok", "capabilities": ["x"], "topics": ["t"], "contracts": [{"topic": "v"}]}]
    with pytest.raises(ValidationFailed):
        E.unpack_announcement(P.pack({"site": "b", "agents": [{}] * (E.MAX_ANNOUNCED + 1)}), 1 << 20)


def rec(name: str, *topics: str) -> dict[str, Any]:
    return {"name": name, "capabilities": [], "topics": list(topics), "contracts": []}


def test_qualified_names_always_plain_names_only_when_unambiguous() -> None:
    d = RemoteDirectory("a")
    d.apply("b", [rec("researcher"), rec("shared"), rec("mine")], 0.0)
    d.apply("c", [rec("shared")], 0.0)
    names = d.names(local={"mine"})
    assert names["researcher:b"] == ProxyName("b", "researcher", False)
    assert names["researcher"] == ProxyName("b", "researcher", True)
    assert "shared" not in names and {"shared:b", "shared:c"} <= set(names)  # two sites have it
    assert "mine" not in names and "mine:b" in names  # a local agent has it
    assert d.apply("a", [rec("x")], 0.0) is False  # its own site's announcements are ignored


def test_sites_not_heard_from_expire() -> None:
    d = RemoteDirectory("a", hold=5.0)
    d.apply("b", [rec("r", "news")], 0.0)
    assert d.topics() == {"news"}
    assert d.expire(4.0) == [] and d.expire(5.5) == ["b"]
    assert d.names(set()) == {} and d.topics() == set()


def test_bounds_are_counted_never_exceeded() -> None:
    d = RemoteDirectory("a", max_sites=2, max_agents=3)
    assert d.apply("b", [rec("1"), rec("2")], 0.0)
    assert d.apply("c", [rec("3"), rec("4")], 0.0)
    assert d.refused_agents == 1 and sum(len(s.agents) for s in d.sites.values()) == 3
    assert not d.apply("d", [rec("5")], 0.0) and d.refused_sites == 1
