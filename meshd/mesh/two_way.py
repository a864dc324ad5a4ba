"""Both-ways liveness: our HELLO/heartbeat sequence numbers and when each was sent.

A peer proves it hears us by echoing (header ``echo``) the last ``seq`` it received from us, as
BFD and ZRE's PING/PING-OK do. :class:`EchoClock` numbers what we send and remembers the recent
numbers; an echo that names a newer number of ours than the peer echoed before is *progress*:
our recent messages reach it. The peer is both-ways while progress was seen within a limit (on
our own monotonic clock; no clock of another host is ever compared). Progress, not the age of
the echoed message, so that a congested link (our messages queued, arriving late but arriving)
is not mistaken for a one-way link; and while our DEALER to the peer is connected but full
(EAGAIN), the link counts as congested, not one-way.

Owns: the sequence counter, a bounded record of send times, and the three echo fields of a peer
record (``heard_seq``, ``echoes``, ``confirmed_at``). It must not touch sockets or peer states:
peers.py asks it and decides.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from meshd.wire import protocol as P

__all__ = ["EchoClock", "Echoing"]


class Echoing(Protocol):
    """The echo fields of a peer record (meshd.mesh.peers.Peer has them)."""

    heard_seq: int | None  # the last SEQ it sent us: we echo it
    last_echo: int  # the newest of our SEQs it has echoed
    confirmed_at: float  # when its echo last made progress (our monotonic clock)
    congested_at: float  # when a send to it last found our connected DEALER full
    link_up: bool  # our DEALER's connection to it is up (monitor events)
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

    def sent_at(self, echo: object) -> float | None:
        """When we sent the message numbered ``echo`` (None: not ours, or too old to remember)."""
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

    def took(self, peer: Echoing, header: P.Header | Mapping[str, Any], now: float) -> None:
        """Note the peer's SEQ (to echo it), and whether its ECHO shows progress: it hears us."""
        seq = header.get(P.SEQ)
        if type(seq) is int:
            peer.heard_seq = seq
            peer.echoes = True
        echo = header.get(P.ECHO)
        if type(echo) is int and echo > peer.last_echo and echo in self._sent:
            peer.last_echo = echo
            peer.confirmed_at = now

    @staticmethod
    def two_way(peer: Echoing, now: float, limit: float) -> bool:
        """Whether the peer's echo progressed within ``limit`` seconds, or our connected DEALER to
        it was full then (congested, not one-way), or it never echoes (an older meshd)."""
        return (not peer.echoes or now - peer.confirmed_at <= limit
                or (peer.link_up and now - peer.congested_at <= limit))
