"""The directory alone (no sockets): the name-conflict rule, remote records, the topic index."""

from __future__ import annotations

from typing import Any

from meshd.mesh.directory import Directory, LocalAgent, loses_name
from meshd.wire import protocol as P


def _agent(name: str, reg: int, rid: bytes = b"r1") -> LocalAgent:
    # registered_at (wall clock, display only) deliberately disagrees with reg: it must not count.
    return LocalAgent(name=name, rid=rid, capabilities=[], metadata={}, registered_at=-float(reg), reg=reg)


def _rec(name: str, node: str, reg: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "node": node, "reg": reg, "registered_at": 0.0, **extra}


def test_the_smaller_registration_counter_keeps_the_name() -> None:
    mine = _agent("planner", reg=100)
    assert loses_name(mine, "bbbb", _rec("planner", "cccc", 99))  # theirs is earlier
    assert not loses_name(mine, "bbbb", _rec("planner", "cccc", 101))  # ours is earlier


def test_an_equal_counter_goes_to_the_smaller_node_id() -> None:
    mine = _agent("planner", reg=100)
    assert loses_name(mine, "bbbb", _rec("planner", "aaaa", 100))
    assert not loses_name(mine, "bbbb", _rec("planner", "cccc", 100))


def test_a_record_without_a_usable_counter_never_wins() -> None:
    for bad in ("yesterday", -1, 1.5, None, True):
        assert not loses_name(_agent("x", 100), "bbbb", _rec("x", "aaaa", bad))


def test_every_node_decides_a_conflict_the_same_way() -> None:
    """The decision uses only what both records carry (no clock), so both sides agree."""
    for reg_a, reg_b in [(3, 7), (7, 3), (5, 5)]:
        a_loses = loses_name(_agent("w", reg_a), "aaaa", _rec("w", "bbbb", reg_b))
        b_loses = loses_name(_agent("w", reg_b), "bbbb", _rec("w", "aaaa", reg_a))
        assert a_loses != b_loses
        third = Directory("zzzz")
        third.apply_node("aaaa", {"agents": [_rec("w", "aaaa", reg_a)]})
        third.apply_node("bbbb", {"agents": [_rec("w", "bbbb", reg_b)]})
        assert third.host_of("w") == ("bbbb" if a_loses else "aaaa")


def test_the_registration_counter_is_a_lamport_clock() -> None:
    d = Directory("bbbb")
    assert d.next_reg() == 1
    d.apply_node("aaaa", {"agents": [_rec("x", "aaaa", 41), _rec("y", "aaaa", "junk")]})
    assert d.next_reg() == 42  # a registration after seeing 41 orders after it
    d.apply_node("cccc", {"agents": [_rec("z", "cccc", 5)]})
    assert d.next_reg() == 43


def test_apply_node_reports_the_local_loser_and_routes_the_name_there() -> None:
    d = Directory("bbbb")
    mine = _agent("planner", reg=100)
    d.add_local(mine)
    applied = d.apply_node("aaaa", {"version": 7, "agents": [_rec("planner", "aaaa", 50),
                                                             _rec("other", "aaaa", 1)]})
    assert applied == (7, [mine])
    assert d.host_of("planner") == "aaaa" and d.host_of("other") == "aaaa"


def test_apply_node_keeps_a_local_winner_local() -> None:
    d = Directory("bbbb")
    d.add_local(_agent("planner", reg=1))
    assert d.apply_node("aaaa", {"version": 1, "agents": [_rec("planner", "aaaa", 50)]}) == (1, [])
    assert d.host_of("planner") is None


def test_two_remote_holders_the_earlier_keeps_it() -> None:
    d = Directory("zzzz")
    d.apply_node("aaaa", {"agents": [_rec("w", "aaaa", 10)]})
    d.apply_node("cccc", {"agents": [_rec("w", "cccc", 5)]})
    assert d.host_of("w") == "cccc"
    d.apply_node("dddd", {"agents": [_rec("w", "dddd", 20)]})
    assert d.host_of("w") == "cccc"


def test_bad_bodies_change_nothing_and_bad_names_are_skipped() -> None:
    d = Directory("zzzz")
    assert d.apply_node("aaaa", "nope") is None
    assert d.apply_node("aaaa", {"agents": "nope"}) is None
    body = {"agents": [_rec("a@b", "aaaa", 1), 5, _rec("ok", "aaaa", 1)]}
    assert d.apply_node("aaaa", body) == (-1, [])
    assert d.records_of("aaaa").keys() == {"ok"}


def test_drop_node_forgets_its_agents_and_their_topics() -> None:
    d = Directory("zzzz")
    d.apply_node("aaaa", {"agents": [_rec("s", "aaaa", 1, topics=["news"], durable=["news"])]})
    assert d.remote_subscribers("news") == 1 and d.durable_subscribers("news") == ["s"]
    d.drop_node("aaaa")
    assert d.host_of("s") is None and d.remote_subscribers("news") == 0 and d.remote_count() == 0


def test_topic_index_first_and_last_subscriber_give_the_key() -> None:
    d = Directory("zzzz")
    a, b = _agent("a", 1, b"ra"), _agent("b", 1, b"rb")
    d.add_local(a)
    d.add_local(b)
    assert d.subscribe(a, "news") == (True, P.topic_key("news"))
    assert d.subscribe(b, "news") == (True, None)
    assert d.subscribe(b, "news") == (False, None)  # idempotent
    assert d.subscribe(b, "news", durable=True) == (True, None)  # durability changed
    assert d.local_topic_keys[P.topic_key("news")] == {a, b}
    assert d.unsubscribe(a, "news") == (True, None)
    assert d.remove_local(b) == [P.topic_key("news")]  # the last one: peers unsubscribe
    assert d.remove_local(b) is None and "news" not in d.local_topics


def test_version_and_body() -> None:
    d = Directory("zzzz")
    d.add_local(_agent("a", 1))
    assert d.bump() == 1
    body = d.body()
    assert body["version"] == 1 and [r["name"] for r in body["agents"]] == ["a"]
    assert body["agents"][0]["node"] == "zzzz"
