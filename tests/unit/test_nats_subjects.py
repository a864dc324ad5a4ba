"""The name and topic mapping of ``meshd bridge`` (meshd/bindings/nats/subjects.py): reversible,
and never a character NATS gives a meaning to."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshd.bindings.nats.subjects import (
    Subjects,
    decode_token,
    encode_token,
    qualified,
    split_qualified,
    valid_site,
)
from meshd.errors import ValidationFailed
from meshd.wire import protocol as P

NATS_SPECIAL = set(".*> \t\r\n$")

names = st.text(min_size=1, max_size=128).filter(P.valid_name)
texts = st.text(max_size=200)
sites = st.from_regex(r"[a-z0-9][a-z0-9-]{0,62}", fullmatch=True)


@given(texts)
def test_any_text_round_trips_and_is_one_plain_token(text: str) -> None:
    token = encode_token(text)
    assert decode_token(token) == text
    assert token
    assert not NATS_SPECIAL & set(token)
    assert token.isascii()


@given(names)
def test_every_valid_agent_name_round_trips(name: str) -> None:
    token = encode_token(name)
    assert decode_token(token) == name
    assert not NATS_SPECIAL & set(token)


@given(texts, texts)
def test_different_texts_never_share_a_token(a: str, b: str) -> None:
    if a != b:
        assert encode_token(a) != encode_token(b)


@given(st.lists(st.text(max_size=20).filter(lambda t: "." not in t), min_size=1, max_size=6))
def test_topics_round_trip_token_by_token(parts: list[str]) -> None:
    subjects = Subjects("meshd")
    topic = ".".join(parts)
    subject = subjects.topic(topic)
    assert subject.count(".") == 2 + topic.count(".")
    assert subjects.topic_from(subject) == topic
    assert "*" not in subject and ">" not in subject  # a published '*' is a literal token


def test_pattern_wildcards_become_nats_wildcards() -> None:
    s = Subjects("meshd")
    assert s.topic_pattern("sensors.*.temp") == "meshd.t.sensors.*.temp"
    assert s.topic_pattern("sensors.>") == "meshd.t.sensors.>"
    assert s.topic_pattern("a.>.b") == f"meshd.t.a.{encode_token('>')}.b"  # '>' only last
    assert s.topic_pattern("we*rd.x") == f"meshd.t.{encode_token('we*rd')}.x"


@given(names, sites)
def test_qualified_names_split_back(name: str, site: str) -> None:
    q = qualified(name, site)
    assert P.valid_name(q)  # a valid mesh name itself: a proxy agent registers it
    assert "@" not in q
    assert split_qualified(q) == (name, site)


@pytest.mark.parametrize("bad", ["a_", "a_2", "a_zz", "a.b", "a*", "é", "", "_c3"])
def test_tokens_that_no_text_makes_are_refused(bad: str) -> None:
    with pytest.raises(ValidationFailed):
        decode_token(bad)


def test_sites_and_prefixes_are_checked() -> None:
    assert valid_site("lab-2") and not valid_site("Lab") and not valid_site("a.b") and not valid_site("-x")
    assert split_qualified("plain") is None and split_qualified("a:B") is None
    with pytest.raises(ValidationFailed):
        Subjects("bad prefix")
    with pytest.raises(ValidationFailed):
        Subjects("a..b")


def test_covers_compares_patterns_token_by_token() -> None:
    from meshd.bindings.nats.subjects import cover, covers

    assert covers("a.>", "a.b") and covers("a.>", "a.*.c") and covers("a.>", "a.>")
    assert covers("a.*", "a.b") and not covers("a.*", "a.>") and not covers("a.*", "a.b.c")
    assert not covers("a.*.c", "a.b.*") and not covers("a.b.*", "a.*.c")
    assert not covers("a.b", "a.*") and covers("a.b", "a.b") and not covers("a.>", "a")
    assert covers(">", "x") and covers("*.*", "a.*") and not covers("*", ">")
    assert cover({"news.today", "news.*", "a.*.c", "a.b.*", "a.>", "z"}) == {"news.*", "a.>", "z"}
    assert cover({"a.*.c", "a.b.*"}) == {"a.*.c", "a.b.*"}  # overlapping: the bridge dedups those


_tok = st.sampled_from(["a", "b", "c"])
_pattern = st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=3).flatmap(
    lambda head: st.sampled_from([".".join(head), ".".join([*head, ">"])]))


@given(_pattern, _pattern, st.lists(_tok, min_size=1, max_size=5))
def test_a_pattern_that_covers_another_matches_what_it_matches(wide: str, narrow: str,
                                                               topic: list[str]) -> None:
    from meshd.bindings.nats.subjects import covers
    from meshd.wire import topics as T

    t = ".".join(topic)
    if covers(wide, narrow) and T.matches(T.split(narrow), t):
        assert T.matches(T.split(wide), t)
