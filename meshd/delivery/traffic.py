"""Messages local agents sent, by kind and topic: the protocol's throughput by message type.

Owns: one bounded tally. Topics are the agents' to choose, so only the first ``topic_cap``
distinct topics are named; later ones are counted under ``other`` (a metrics backend suffers
from an unbounded label set long before this daemon would). A batch counts as its messages
(its ``count``), by the kind it declares, in one update: the routing path pays one dict bump per frame set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

OTHER = "other"
MIXED = "(batch)"
"""The topic label of a batch to one agent: its messages may carry several topics."""


class TrafficTally:
    def __init__(self, topic_cap: int) -> None:
        self.topic_cap = topic_cap
        self.counts: Counter[tuple[str, str]] = Counter()
        self._topics: set[str] = set()

    def _label(self, topic: str) -> str:
        if topic in self._topics:
            return topic
        if len(self._topics) >= self.topic_cap:
            return OTHER
        self._topics.add(topic)
        return topic

    def count(self, kind: str, topic: object) -> None:
        """One message of ``kind`` on ``topic`` (None or not a string: counted under "")."""
        self.counts[(kind, self._label(topic if isinstance(topic, str) else ""))] += 1

    def count_batch(self, kinds: Iterable[object], count: int, topic: object) -> None:
        """A batch of ``count`` messages of the declared ``kinds`` (distinct kinds: one kind names
        them all; several are counted as ``batch``); a batch to an agent has the topic ``(batch)``."""
        label = self._label(topic) if isinstance(topic, str) else MIXED
        distinct = {str(k) for k in kinds}
        kind = distinct.pop() if len(distinct) == 1 else "batch"
        self.counts[(kind, label)] += count

    def snapshot(self) -> dict[tuple[str, str], int]:
        return dict(self.counts)
