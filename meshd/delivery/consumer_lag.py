"""Each local agent's consumer lag: messages written to it and not read yet, and the oldest's age.

The daemon counts the work messages it writes to an agent (``LocalAgent.work_sent``); the
agent's heartbeat says how many it has read (``read``) and how many it holds for a handler slot
(``waiting``, the oldest ``lag_s`` old). Written minus read is what waits in the agent's pipe;
when the oldest of those was written is estimated from samples of the written count, taken once
a snapshot (every second): so the age is good to about a second. Bounded: ``SAMPLES`` per agent.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any

SAMPLES = 600
"""Written-count samples kept per agent (ten minutes at one a second): the longest age it can tell."""


class ConsumerLag:
    def __init__(self) -> None:
        self._samples: dict[str, deque[tuple[int, float]]] = {}

    def sample(self, agents: Iterable[Any], now: float) -> dict[str, tuple[int, float]]:
        """``{agent: (messages waiting, age of the oldest in seconds)}`` for agents whose heartbeat
        says what they read; the agents' ``name``, ``work_sent`` and ``telemetry`` are read."""
        out: dict[str, tuple[int, float]] = {}
        seen: set[str] = set()
        for agent in agents:
            name, sent, tele = agent.name, agent.work_sent, agent.telemetry
            seen.add(name)
            ring = self._samples.get(name)
            if ring is None:
                ring = self._samples[name] = deque(maxlen=SAMPLES)
            if not ring or ring[-1][0] != sent:
                ring.append((sent, now))
            read = tele.get("read")
            if not isinstance(read, int) or isinstance(read, bool):
                continue
            parked = tele.get("waiting")
            parked_n = parked if type(parked) is int and parked > 0 else 0
            in_pipe = max(0, sent - read)
            age = 0.0
            if in_pipe:
                # The first sample whose count passes what was read: the oldest unread was written
                # by then (before the ring's start: at least as old as the ring goes).
                first = next((t for n, t in ring if n > read), ring[0][1])
                age = max(0.0, now - first)
            held = tele.get("lag_s")
            if isinstance(held, int | float) and not isinstance(held, bool) and held > age:
                age = float(held)
            out[name] = (in_pipe + parked_n, round(age, 3))
        for gone in set(self._samples) - seen:
            del self._samples[gone]
        return out
