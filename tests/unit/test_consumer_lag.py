"""ConsumerLag: written minus read, plus what the agent holds; the oldest's age from samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshd.delivery.consumer_lag import SAMPLES, ConsumerLag


@dataclass
class FakeAgent:
    name: str
    work_sent: int = 0
    telemetry: dict[str, Any] = field(default_factory=dict)


def test_lag_counts_unread_and_held_messages_and_ages_the_oldest() -> None:
    lag = ConsumerLag()
    slow = FakeAgent("slow")
    assert lag.sample([slow], 0.0) == {}  # no heartbeat yet: nothing to say
    slow.telemetry = {"read": 0, "waiting": 0, "lag_s": 0.0}
    assert lag.sample([slow], 1.0) == {"slow": (0, 0.0)}
    slow.work_sent = 3  # three written at about t=2
    assert lag.sample([slow], 2.0) == {"slow": (3, 0.0)}
    slow.work_sent = 5
    assert lag.sample([slow], 5.0) == {"slow": (5, 3.0)}  # the oldest unread: written by t=2
    slow.telemetry = {"read": 4, "waiting": 2, "lag_s": 0.5}  # read 4, holds 2 for a slot
    assert lag.sample([slow], 6.0) == {"slow": (3, 1.0)}  # the 5th, written by t=5
    slow.telemetry = {"read": 5, "waiting": 1, "lag_s": 7.5}
    assert lag.sample([slow], 7.0) == {"slow": (1, 7.5)}  # only held: the agent's own age


def test_hostile_telemetry_and_departed_agents() -> None:
    lag = ConsumerLag()
    a = FakeAgent("a", 2, {"read": True, "waiting": "x"})
    b = FakeAgent("b", 2, {"read": 9, "waiting": -3, "lag_s": "old"})
    assert lag.sample([a, b], 1.0) == {"b": (0, 0.0)}  # bool is no count; more read than sent: 0
    lag.sample([b], 2.0)
    assert set(lag._samples) == {"b"}  # a left: its samples go
    for t in range(SAMPLES * 2):
        b.work_sent += 1
        lag.sample([b], float(t))
    assert len(lag._samples["b"]) == SAMPLES
