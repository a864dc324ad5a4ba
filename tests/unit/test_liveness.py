"""The online -> stale -> offline rule, driven by a fake clock (ages in seconds)."""

from __future__ import annotations

import pytest

from meshd.mesh.liveness import PeerState, next_state

ONLINE, STALE, OFFLINE = PeerState.ONLINE, PeerState.STALE, PeerState.OFFLINE


@pytest.mark.parametrize("state,age,expected", [
    (ONLINE, 0.5, None), (ONLINE, 3.0, None), (ONLINE, 3.01, STALE), (ONLINE, 10.5, OFFLINE),
    (STALE, 5.0, None), (STALE, 10.01, OFFLINE), (OFFLINE, 50.0, None), (OFFLINE, 0.0, None),
])
def test_next_state(state: PeerState, age: float, expected: PeerState | None) -> None:
    assert next_state(state, age, stale_after=3.0, offline_after=10.0) is expected


def test_a_silent_peer_walks_online_stale_offline_on_a_fake_clock() -> None:
    state, seen = ONLINE, []
    for now in [x * 0.25 for x in range(60)]:  # 15 s of silence, ticks of 0.25 s
        new = next_state(state, now, 3.0, 10.0)
        if new is not None:
            state = new
            seen.append((now, new))
    assert seen == [(3.25, STALE), (10.25, OFFLINE)]
