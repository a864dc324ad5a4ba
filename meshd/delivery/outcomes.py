"""Collaboration outcomes: one per send, request, delegate and handoff, counted and observed.

The node reports what it routes for its local agents; this module counts it (``Tally``: counts
by kind and outcome, error codes, latency histograms, read by ``MetricsSnapshot`` and so by a
metrics plugin at scrape time) and, only while some plugin implements ``meshd_collaboration``,
turns each into an event (initiator, target, topic, outcome, error code, latency). Counting is
always on and cheap: a batch of sends is counted from its header (``count``, ``kinds``) without
opening it; only observers make the daemon open batches to report each message.
Requests are timed from the moment they leave their requester's daemon until the reply or error
comes back to it; a request that never gets an answer is reported as TIMEOUT after its deadline.

Owns: the requests in flight from local agents (each forgotten after its deadline) and the events it
emits. It must not change routing: routing.py reports to it after each decision.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any

from meshd.plugins.host import PluginHost
from meshd.view import LatencyReading
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind

LATENCY_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                         0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the latency histograms' buckets; +Inf comes last."""
LATENCY_WINDOW = 1024
"""Recent latencies kept per kind (for quantiles)."""
MAX_TALLY_KEYS = 64
"""Distinct (kind, outcome) and (kind, code) pairs counted; past it, counted as ("other", "other"):
error codes can come from peers."""


class _Latency:
    __slots__ = ("counts", "recent", "sum_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.sum_s = 0.0
        self.recent: deque[float] = deque(maxlen=LATENCY_WINDOW)


class Tally:
    """What the node counts of collaborations itself: no event, no copy, no thread per message."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self.latency: dict[str, _Latency] = {}

    @staticmethod
    def _bump(counter: Counter[tuple[str, str]], key: tuple[str, str], n: int) -> None:
        if key not in counter and len(counter) >= MAX_TALLY_KEYS:
            key = ("other", "other")
        counter[key] += n

    def add(self, kind: str, outcome: str, code: str | None = None, latency_ms: float | None = None,
            n: int = 1) -> None:
        self._bump(self.counts, (kind, outcome), n)
        if outcome == "error":
            self._bump(self.errors, (kind, code or "ERROR"), n)
        if latency_ms is not None and latency_ms >= 0:
            lat = self.latency.get(kind)
            if lat is None:
                if len(self.latency) >= MAX_TALLY_KEYS:
                    return
                lat = self.latency[kind] = _Latency()
            seconds = latency_ms / 1000.0
            lat.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1  # le is inclusive
            lat.sum_s += seconds
            lat.recent.append(seconds)

    def readings(self) -> dict[str, LatencyReading]:
        return {kind: LatencyReading(LATENCY_BUCKETS_S, tuple(lat.counts), lat.sum_s, tuple(lat.recent))
                for kind, lat in self.latency.items()}


class Outcomes:
    """Tracks the requests in flight from local agents and emits their outcomes."""

    def __init__(self, plugins: PluginHost) -> None:
        self.plugins = plugins
        self.enabled = False  # does any plugin implement meshd_collaboration? (follow_plugins)
        self.tally = Tally()
        # (requester, request id) -> (t0, kind, initiator, target, topic, expires)
        self.inflight: dict[tuple[str, str], tuple[float, str, str, str, str, float]] = {}

    def follow_plugins(self) -> None:
        """Outcome tracking costs the routing path: on only while a plugin observes outcomes."""
        self.enabled = self.plugins.wants("meshd_collaboration")

    def emit(self, kind: str, msg_id: Any, initiator: Any, target: Any, topic: Any, outcome: str,
             error_code: str | None = None, latency_ms: float | None = None, qos: int = 0) -> None:
        self.tally.add(kind, outcome, error_code, latency_ms)
        if not self.enabled:
            return
        self.plugins.collaboration({
            "kind": kind, "id": msg_id, "initiator": initiator, "target": target, "topic": topic,
            "outcome": outcome, "error_code": error_code, "latency_ms": latency_ms, "qos": qos,
            "at": time.time(),
        })

    def outgoing(self, header: P.Header, msg: list[bytes]) -> list[Mapping[str, Any]]:
        """A local agent's message is about to be routed: start its requests' clocks.

        Returns the headers of the sends in it; the caller reports them once routing said
        whether they went through (``sends_routed``).
        """
        headers: list[Mapping[str, Any]] = [header.fields]
        if header.kind == Kind.BATCH:
            kinds = header.get(P.KINDS)
            if not self.enabled and kinds == [Kind.SEND]:  # counted from its header, not opened
                return [header.fields]
            with contextlib.suppress(FrameError):
                headers = [h | {P.FROM: header.sender, P.TO: header.to}
                           for h, _ in P.split_batch(msg)]
        now = time.monotonic()
        sends = []
        for h in headers:
            kind = h.get(P.KIND)
            if kind == Kind.SEND:
                sends.append(h)
            elif kind == Kind.REQUEST:
                what = ("delegate" if h.get(P.ORIGIN) else
                        "handoff" if h.get(P.TOPIC) == P.HANDOFF_TOPIC else "request")
                if what == "delegate":  # the answer goes to the origin, past this daemon
                    self.emit(what, h.get(P.ID), h.get(P.FROM), h.get(P.TO), h.get(P.TOPIC), "sent")
                    continue
                try:
                    deadline = P.local_deadline(h)  # the budget, on this host's monotonic clock
                except FrameError:
                    deadline = None
                expires = (now + 30.0 if deadline is None else deadline) + 5
                self.inflight[(str(h.get(P.FROM)), str(h.get(P.ID)))] = (
                    now, what, str(h.get(P.FROM)), str(h.get(P.TO)), str(h.get(P.TOPIC)), expires)
        return sends

    def sends_routed(self, sends: list[Mapping[str, Any]], error_code: str | None) -> None:
        if sends and sends[0].get(P.KIND) == Kind.BATCH:  # a batch of sends, counted unopened
            count = sends[0].get(P.COUNT)
            n = count if type(count) is int and count > 0 else 1
            self.tally.add("send", "error" if error_code else "sent", error_code, n=n)
            return
        for h in sends:
            self.emit("send", h.get(P.ID), h.get(P.FROM), h.get(P.TO), h.get(P.TOPIC),
                      "error" if error_code else "sent", error_code)

    def answer(self, requester: str, header: P.Header, msg: list[bytes]) -> None:
        """A reply or error reaching a local requester closes its request's outcome."""
        if not self.inflight:
            return
        headers: list[Mapping[str, Any]] = [header.fields]
        if header.kind == Kind.BATCH:
            with contextlib.suppress(FrameError):
                headers = [h for h, _ in P.split_batch(msg)]
        now = time.monotonic()
        for h in headers:
            kind = h.get(P.KIND)
            if kind not in (Kind.REPLY, Kind.ERROR):
                continue
            started = self.inflight.pop((requester, str(h.get(P.CORR))), None)
            if started is None:
                continue
            t0, what, initiator, target, topic, _ = started
            latency = round((now - t0) * 1000, 3)
            if kind == Kind.ERROR:
                err = h.get(P.ERROR)
                code = str(err.get("code")) if isinstance(err, dict) else "ERROR"
                self.emit(what, h.get(P.CORR), initiator, target, topic, "error", code, latency)
            elif what == "handoff":
                status = h.get(P.STATUS)
                self.emit(what, h.get(P.CORR), initiator, target, topic,
                          "accepted" if status == "accepted" else "rejected", None, latency)
            else:
                self.emit(what, h.get(P.CORR), initiator, target, topic, "ok", None, latency)

    def delivered(self, unit_id: str, sender: str, dest: str, topic: str | None, created: float) -> None:
        """A qos-1 unit was acknowledged: its handler finished on the receiving side.
        ``created`` is this host's ``time.monotonic()`` when the unit was accepted."""
        self.emit("send", unit_id, sender, dest, topic, "delivered", None,
                  round((time.monotonic() - created) * 1000, 3), qos=1)

    def expire(self) -> None:
        """Requests past their deadline with no answer: report TIMEOUT and forget them."""
        now = time.monotonic()
        for key, (t0, what, initiator, target, topic, expires) in list(self.inflight.items()):
            if now > expires:
                del self.inflight[key]
                self.emit(what, key[1], initiator, target, topic, "error", P.ErrorCode.TIMEOUT,
                          round((now - t0) * 1000, 3))
