"""TrafficTally: messages by kind and topic, the topic label set bounded."""

from __future__ import annotations

from meshd.delivery.traffic import MIXED, OTHER, TrafficTally


def test_topics_past_the_cap_are_other_and_batches_count_their_messages() -> None:
    t = TrafficTally(topic_cap=2)
    t.count("send", "a")
    t.count("request", "b")
    t.count("send", "c")  # a third topic: past the cap
    t.count("send", "a")
    t.count("publish", None)  # no topic: ""... which is a new label, so "other" too
    t.count_batch(["publish"], 40, "b")
    t.count_batch(["send"], 7, None)  # a batch to an agent: several topics inside
    t.count_batch(["send", "request"], 3, None)
    snap = t.snapshot()
    assert snap[("send", "a")] == 2 and snap[("request", "b")] == 1 and snap[("send", OTHER)] == 1
    assert snap[("publish", OTHER)] == 1 and snap[("publish", "b")] == 40
    assert snap[("send", MIXED)] == 7 and snap[("batch", MIXED)] == 3
    assert len({topic for _, topic in snap}) == 4  # a, b, other, (batch): bounded
