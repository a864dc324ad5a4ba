"""Mesh names and topics as NATS subject tokens, and site-qualified names (docs/sites.md, "Naming").

Pure: no sockets, no NATS client. NATS gives ``.``, ``*``, ``>`` and whitespace a meaning in
subjects and reserves a leading ``$``; mesh names and topics may hold any of them (and any
non-ASCII). A token keeps ``A-Z a-z 0-9 -`` as they are and writes every other UTF-8 byte as
``_`` and two lowercase hex digits; the empty string is ``_`` alone. So the mapping is reversible,
its output is a valid subject token (and a valid JetStream KV key part), and two different inputs
never meet.

A topic is split on ``.`` first (meshd topics are dot-separated tokens, like NATS subjects), each
token encoded, so a topic pattern's ``*`` and ``>`` tokens become NATS wildcards and filtering
happens in NATS as it happens in meshd.
"""

from __future__ import annotations

import re
from typing import Final

from meshd.errors import ValidationFailed
from meshd.wire import protocol as P

__all__ = ["DEFAULT_PREFIX", "SITE_SEP", "Subjects", "cover", "covers", "decode_token", "encode_token",
           "qualified", "split_qualified", "topic_of_subject", "valid_site"]

SITE_SEP: Final = ":"
"""``name:site`` names an agent of another site (``@`` stays ``name@node``, within one mesh)."""
DEFAULT_PREFIX: Final = "meshd"
_PLAIN: Final = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-")
_HEX: Final = frozenset(b"0123456789abcdef")
_SITE_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,62}\Z")


def encode_token(text: str) -> str:
    """``text`` as one subject token (see the module docstring)."""
    if text == "":
        return "_"
    out: list[str] = []
    for byte in text.encode("utf-8", "surrogatepass"):
        out.append(chr(byte) if byte in _PLAIN else f"_{byte:02x}")
    return "".join(out)


def decode_token(token: str) -> str:
    """The text :func:`encode_token` made ``token`` from; :class:`ValidationFailed` if it made none."""
    if token == "_":
        return ""
    raw = bytearray()
    i, n = 0, len(token)
    while i < n:
        ch = token[i]
        if ch == "_":
            pair = token[i + 1:i + 3].encode("ascii", "replace")
            if len(pair) != 2 or not set(pair) <= _HEX:
                raise ValidationFailed(f"bad escape in subject token {P.safe_repr(token)}")
            raw.append(int(pair, 16))
            i += 3
            continue
        if len(ch.encode("utf-8", "replace")) != 1 or ord(ch) not in _PLAIN:
            raise ValidationFailed(f"character {ch!r} cannot appear in an encoded token")
        raw.append(ord(ch))
        i += 1
    if not raw:
        raise ValidationFailed("an empty subject token encodes nothing")
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise ValidationFailed(f"subject token {P.safe_repr(token)} is not UTF-8") from None


def valid_site(site: object) -> bool:
    """Site names: 1-63 of ``a-z 0-9 -``, not starting with ``-``: a subject token as they are,
    and never containing :data:`SITE_SEP`, so ``name:site`` splits at its last colon."""
    return isinstance(site, str) and _SITE_RE.match(site) is not None


def qualified(name: str, site: str) -> str:
    """The name an agent of ``site`` has in other sites' directories."""
    return f"{name}{SITE_SEP}{site}"


def split_qualified(text: str) -> tuple[str, str] | None:
    """``(name, site)`` of a site-qualified name, None if ``text`` is not one."""
    name, sep, site = text.rpartition(SITE_SEP)
    if not sep or not name or not valid_site(site):
        return None
    return name, site


def _tokens(topic: str, *, pattern: bool) -> str:
    parts = topic.split(".")
    out = []
    for i, part in enumerate(parts):
        if pattern and part == "*":
            out.append("*")
        elif pattern and part == ">" and i == len(parts) - 1:
            out.append(">")
        else:
            out.append(encode_token(part))
    return ".".join(out)


def covers(wide: str, narrow: str) -> bool:
    """Does subscription ``wide`` match every topic that subscription ``narrow`` matches? Both are
    exact topics or meshd patterns (``*`` one token, a last ``>`` one or more), compared token by
    token: ``a.>`` covers ``a.b``, ``a.*.c`` and ``a.>``; ``a.*`` covers ``a.b`` but not ``a.>``;
    ``a.*.c`` and ``a.b.*`` overlap and neither covers the other."""
    w, n = wide.split("."), narrow.split(".")
    if w[-1] == ">":
        if len(n) < len(w):
            return False
        head = len(w) - 1
    else:
        if len(n) != len(w) or n[-1] == ">":
            return False
        head = len(w)
    for i in range(head):
        if w[i] == "*":
            if n[i] == ">":
                return False
        elif w[i] != n[i] or n[i] in ("*", ">"):
            return False
    return True


def cover(topics: set[str]) -> set[str]:
    """The subscriptions of ``topics`` that no other one of them covers: subscribed to in NATS,
    they reach every topic ``topics`` reach, with fewer overlaps (what overlaps still, such as
    ``a.*.c`` beside ``a.b.*``, the bridge drops by publication id). Quadratic: for the bounded
    set (``max_topics``) the bridge follows."""
    return {t for t in topics if not any(o != t and covers(o, t) for o in topics)}


def topic_of_subject(tokens: str) -> str:
    """The topic a subject's topic tokens were made from."""
    return ".".join(decode_token(t) for t in tokens.split("."))


class Subjects:
    """The subjects of one NATS namespace (``prefix``, default ``meshd``): one per purpose."""

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        if not prefix or any(not t or not set(t.encode()) <= _PLAIN for t in prefix.split(".")):
            raise ValidationFailed(f"bad subject prefix {prefix!r}: dot-separated tokens of A-Z a-z 0-9 -")
        self.prefix = prefix

    def agent(self, site: str, name: str) -> str:
        """Sends and requests (qos 0) to agent ``name`` of ``site``."""
        return f"{self.prefix}.a.{site}.{encode_token(name)}"

    def agents_of(self, site: str) -> str:
        return f"{self.prefix}.a.{site}.*"

    def qos1(self, site: str, name: str) -> str:
        """qos-1 sends to agent ``name`` of ``site``: a JetStream stream keeps them."""
        return f"{self.prefix}.q.{site}.{encode_token(name)}"

    def qos1_of(self, site: str) -> str:
        return f"{self.prefix}.q.{site}.*"

    def qos1_all(self) -> str:
        return f"{self.prefix}.q.>"

    def cancel(self, site: str) -> str:
        """Cancels of requests that ``site``'s bridges are working on."""
        return f"{self.prefix}.c.{site}"

    def directory(self, site: str) -> str:
        """``site``'s directory announcements."""
        return f"{self.prefix}.d.{site}"

    def directories(self) -> str:
        return f"{self.prefix}.d.*"

    def topic(self, topic: str) -> str:
        """A publication on ``topic`` (every token literal: a published ``*`` is no wildcard)."""
        return f"{self.prefix}.t.{_tokens(topic, pattern=False)}"

    def topic_pattern(self, pattern: str) -> str:
        """A subscription to ``pattern``: its ``*`` tokens and a last ``>`` are NATS wildcards."""
        return f"{self.prefix}.t.{_tokens(pattern, pattern=True)}"

    def topic_from(self, subject: str) -> str:
        """The topic of a publication's subject; :class:`ValidationFailed` if it is none of ours."""
        head = f"{self.prefix}.t."
        if not subject.startswith(head):
            raise ValidationFailed(f"subject {P.safe_repr(subject)} is not a topic of {self.prefix!r}")
        return topic_of_subject(subject[len(head):])

    def stream_name(self) -> str:
        """The JetStream stream of qos-1 sends (a name without ``.``)."""
        return "MESHD_" + self.prefix.replace(".", "_").replace("-", "_").upper() + "_QOS1"
