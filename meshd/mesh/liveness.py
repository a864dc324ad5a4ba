"""The online -> stale -> offline rule, for peers and local agents alike.

Owns: the :class:`PeerState` values and :func:`next_state`, a pure function of the time since
something was last heard from. It must not touch sockets, clocks or tables: callers pass the age
(their own monotonic clock), so tests drive it with a fake clock.
"""

from __future__ import annotations

import enum

__all__ = ["PeerState", "next_state"]


class PeerState(enum.StrEnum):
    ONLINE = "online"
    STALE = "stale"
    #: Peers only: we hear it, but it has not confirmed hearing us (docs/PROTOCOL.md §9.5).
    ONE_WAY = "one-way"
    OFFLINE = "offline"


def next_state(state: PeerState, age: float, stale_after: float, offline_after: float) -> PeerState | None:
    """The state something should move to after ``age`` seconds of silence, or None to stay.

    Offline wins over stale; only an online (or one-way) thing turns stale (a stale one waits
    for offline); nothing comes back online here (only traffic does that).
    """
    if age > offline_after:
        return PeerState.OFFLINE if state is not PeerState.OFFLINE else None
    if age > stale_after and state in (PeerState.ONLINE, PeerState.ONE_WAY):
        return PeerState.STALE
    return None
