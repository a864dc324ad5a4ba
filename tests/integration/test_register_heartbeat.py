"""docs/PROTOCOL.md §8.2: the ``register`` answer tells a client the daemon's
``heartbeat_interval``, and agents MUST beat at least that often. The Python client used its own
interval (1 s) whatever the daemon said; now it beats at the daemon's when that is shorter, and
keeps its own when that is shorter."""

from __future__ import annotations

import asyncio

from meshd import Agent
from meshd.testing import MeshdFactory


def test_the_client_beats_at_least_as_often_as_the_daemon_asks(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")  # fast liveness: heartbeat_interval 0.25 s

    async def scenario() -> tuple[float, float]:
        async with Agent("default-beat", socket=a.socket) as slow, \
                Agent("fast-beat", socket=a.socket, heartbeat_interval=0.1) as fast:
            return slow.heartbeat_interval, fast.heartbeat_interval

    slow, fast = asyncio.run(scenario())
    assert slow == 0.25, slow  # the daemon's, shorter than the default 1 s
    assert fast == 0.1, fast  # the agent's own, already shorter
