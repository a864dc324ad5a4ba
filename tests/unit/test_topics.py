"""Wildcard topic patterns (meshd/wire/topics.py): matching, the SUB prefix, refusals."""

from __future__ import annotations

import pytest

from meshd.wire import topics as T


@pytest.mark.parametrize(("pattern", "topic", "hit"), [
    ("results.*", "results.x", True),
    ("results.*", "results", False),
    ("results.*", "results.x.y", False),
    ("results.>", "results.x", True),
    ("results.>", "results.x.y.z", True),
    ("results.>", "results", False),
    ("*.errors", "db.errors", True),
    ("*.errors", "db.errors.x", False),
    ("*.errors", "errors", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.b.d", False),
    (">", "anything.at.all", True),
    ("*", "one", True),
    ("*", "two.tokens", False),
])
def test_matches(pattern: str, topic: str, hit: bool) -> None:
    assert T.is_pattern(pattern)
    assert T.matches(T.split(pattern), topic) is hit


def test_literal_tokens_are_not_patterns() -> None:
    assert not T.is_pattern("results.x")
    assert not T.is_pattern("res*.x")  # a token that merely contains '*' is literal
    assert not T.is_pattern("a>b")


@pytest.mark.parametrize(("pattern", "key"), [
    ("results.*", b"results."), ("results.>", b"results."), ("a.b.*.d", b"a.b."),
    ("*.errors", b""), (">", b""),
])
def test_prefix_key_is_the_literal_part(pattern: str, key: bytes) -> None:
    assert T.prefix_key(pattern) == key


def test_pattern_problems() -> None:
    assert T.pattern_problem("results.>", 16) is None
    assert "last token" in str(T.pattern_problem("a.>.b", 16))
    assert "empty token" in str(T.pattern_problem("a..*", 16))
    assert "max_pattern_tokens=3" in str(T.pattern_problem("a.b.c.*", 3))


def test_handler_for_takes_the_first_matching_pattern_and_keeps_star_as_any() -> None:
    handlers = {"*": "any", "results.x": "exact", "results.*": "one", "results.>": "rest"}
    assert T.handler_for(handlers, "results.y") == "one"
    assert T.handler_for(handlers, "results.y.z") == "rest"
    assert T.handler_for(handlers, "single") is None  # "*" stays the catch-all, not a pattern here
