"""Both-ways liveness: our HELLO/heartbeat sequence numbers and when each was sent.

A peer proves it hears us by echoing (header ``echo``) the last ``seq`` it received from us, as
BFD and ZRE's PING/PING-OK do. :class:`EchoClock` numbers what we send and remembers, on our own
monotonic clock, when each number went out; :meth:`EchoClock.confirmed_at` turns an echo into
"they had heard us as of that moment". No clock of another host is ever compared.

Owns: the sequence counter, a bounded record of send times, and the three echo fields of a peer
record (``heard_seq``, ``echoes``, ``confirmed_at``). It must not touch sockets or peer states:
peers.py asks it and decides.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from . import protocol as P

__all__ = ["EchoClock", "Echoing"]


class Echoing(Protocol):
    """The echo fields of a peer record (meshd.peers.Peer has them)."""

    heard_seq: int | None  # the last SEQ it sent us: we echo it
    confirmed_at: float  # when we sent the newest message it echoed (our monotonic clock)
    echoes: bool  # it sends SEQ; a peer that never does counts as both-ways when heard


class EchoClock:
    """Sequence numbers for our HELLOs and heartbeat rounds, and when each was sent."""

    def __init__(self, keep: int = 256, start: int | None = None) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        # A random start: a peer echoing a number of our previous run never matches by chance.
        self.seq = start if start is not None else int.from_bytes(os.urandom(3), "big")
        self._keep = keep
        self._sent: OrderedDict[int, float] = OrderedDict()

    def next(self, now: float) -> int:
        """A new sequence number, sent at ``now`` (monotonic seconds)."""
        self.seq += 1
        self._sent[self.seq] = now
        while len(self._sent) > self._keep:
            self._sent.popitem(last=False)
        return self.seq

    def confirmed_at(self, echo: object) -> float | None:
        """When we sent the message a peer says it heard last (None: unknown or too old)."""
        if type(echo) is not int:
            return None
        return self._sent.get(echo)

    def header(self, kind: str, node_id: str, peer: Echoing | None, now: float,
               seq: int | None = None, **extra: Any) -> dict[str, Any]:
        """A HELLO or heartbeat header: ``seq`` (default: our next SEQ), and ECHO of the last SEQ
        heard from ``peer``."""
        header: dict[str, Any] = {P.KIND: kind, P.FROM: node_id, **extra,
                                  P.SEQ: self.next(now) if seq is None else seq}
        if peer is not None and peer.heard_seq is not None:
            header[P.ECHO] = peer.heard_seq
        return header

    def took(self, peer: Echoing, header: P.Header | Mapping[str, Any]) -> None:
        """Note the peer's SEQ (to echo it) and what its ECHO proves: it had heard us then."""
        seq = header.get(P.SEQ)
        if type(seq) is int:
            peer.heard_seq = seq
            peer.echoes = True
        sent = self.confirmed_at(header.get(P.ECHO))
        if sent is not None and sent > peer.confirmed_at:
            peer.confirmed_at = sent

    @staticmethod
    def two_way(peer: Echoing, now: float, limit: float) -> bool:
        """Whether the peer confirmed hearing us within ``limit`` seconds (or never echoes)."""
        return not peer.echoes or now - peer.confirmed_at <= limit
