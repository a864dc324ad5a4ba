"""Topic patterns: NATS-style wildcards on dot-separated topics (pure, no sockets).

A subscription topic is a **pattern** when one of its tokens (split on ".") is exactly ``*``
(one token) or ``>`` (one or more tokens, last token only). Any other topic is matched exactly,
as it always was. A token that merely contains ``*`` or ``>`` (``res*``) is a literal.

Filtering stays at the publisher's daemon: a subscriber's daemon subscribes its SUB sockets to
the pattern's **literal prefix** (``PREFIX_KEY``: everything before the first wildcard token,
without the NUL that makes an exact key exact), so a peer's XPUB sends it only publications whose
topic starts with that prefix, and the daemon matches the rest (``matches``) before delivering.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeVar

_V = TypeVar("_V")

__all__ = ["ONE", "REST", "Pattern", "handler_for", "is_pattern", "matches", "pattern_problem", "prefix_key",
           "split"]

ONE: Final = "*"
"""A pattern token matching exactly one token."""
REST: Final = ">"
"""A pattern's last token matching one or more tokens."""

Pattern = tuple[str, ...]
"""A pattern split into its tokens (``topic.split(".")``)."""


def is_pattern(topic: str) -> bool:
    """True if ``topic`` has a wildcard token (``*`` anywhere, ``>`` anywhere: a misplaced ``>``
    makes it a malformed pattern, see ``pattern_problem``)."""
    if ONE not in topic and REST not in topic:
        return False  # the common case costs two substring scans
    return any(t in (ONE, REST) for t in topic.split("."))


def pattern_problem(topic: str, max_tokens: int) -> str | None:
    """Why ``topic`` (a pattern) is refused, or None. ``>`` only as the last token, no empty
    tokens, at most ``max_tokens`` tokens (the caller maps the last to TOO_LARGE)."""
    tokens = topic.split(".")
    if any(not t for t in tokens):
        return f"pattern {topic!r} has an empty token"
    if REST in tokens[:-1]:
        return f"pattern {topic!r}: '>' may only be the last token"
    if len(tokens) > max_tokens:
        return f"pattern {topic!r} has {len(tokens)} tokens; the limit is max_pattern_tokens={max_tokens}"
    return None


def split(topic: str) -> Pattern:
    return tuple(topic.split("."))


def matches(pattern: Pattern, topic: str) -> bool:
    """Does ``topic`` (a publication's topic, never a pattern) match ``pattern``?"""
    tokens = topic.split(".")
    n = len(pattern)
    if pattern[-1] == REST:
        if len(tokens) < n:
            return False
        n -= 1
    elif len(tokens) != n:
        return False
    for i in range(n):
        p = pattern[i]
        if p != ONE and p != tokens[i]:
            return False
    return True


def prefix_key(topic: str) -> bytes:
    """The SUB subscription for pattern ``topic``: its literal prefix up to the first wildcard
    token (``results.*`` -> ``results.``; ``*.errors`` -> empty: every publication sent to us)."""
    tokens = topic.split(".")
    literal: list[str] = []
    for t in tokens:
        if t in (ONE, REST):
            break
        literal.append(t)
    return ("".join(t + "." for t in literal)).encode()


def handler_for(handlers: Mapping[str, _V], topic: str) -> _V | None:
    """The handler of the first pattern (in registration order) that ``topic`` matches, for a
    client whose handlers are keyed by topic; ``*`` alone keeps its meaning of "any topic"."""
    for key, handler in handlers.items():
        if key != ONE and (ONE in key or REST in key) and is_pattern(key) and matches(split(key), topic):
            return handler
    return None
