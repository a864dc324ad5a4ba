"""Scatter-gather: one request to many agents, replies as they come, one summary at the end.

Owns: choosing the targets from the directory (``pick_targets``: names, a capability, or the
subscribers of a topic, on every node), one ordinary request per target (so budget, hops,
progress, cancel and every error code are those of ``Agent.request``), yielding replies as they
arrive, ending at ``want`` replies, when every target has answered or failed, or at the timeout,
and the ``GatherSummary`` of who did what. Ending early (``want`` reached, ``cancel``, leaving an
``async with``, or the consuming task cancelled) cancels the outstanding requests: their handlers
hear the mesh cancel. It is a client pattern on the wire's ``request``: daemons see N requests.

Must not touch: the agent's sockets and call tables (it only calls ``request`` and ``agents``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshd.client import tracing
from meshd.errors import MeshError, RequestTimeout, TooLarge, ValidationFailed
from meshd.wire import topics as T
from meshd.wire.system_names import SYSTEM_PREFIX

__all__ = ["GATHER_MAX_TARGETS", "UNREACHABLE_CODES", "Gather", "GatherReply", "GatherSummary",
           "pick_targets"]

GATHER_MAX_TARGETS = 256
"""Targets of one gather; more are refused with TooLarge (each is a call in flight)."""

UNREACHABLE_CODES = frozenset({"NO_SUCH_AGENT", "PEER_UNREACHABLE", "DAEMON_UNREACHABLE",
                               "DAEMON_STOPPING", "UNDELIVERABLE"})
"""Error codes that mean the request never reached a handler: the target counts as unreachable."""


class Requester(Protocol):
    """What a gather needs of an ``Agent``."""

    name: str

    def request(self, to: str, topic: str, payload: Any = None, *, timeout: float = ...,
                headers: dict[str, Any] | None = None,
                on_progress: Callable[[str], Any] | None = None,
                priority: int = ...) -> Coroutine[Any, Any, Any]: ...

    def agents(self) -> Coroutine[Any, Any, list[dict[str, Any]]]: ...


@dataclass(frozen=True)
class GatherReply:
    """One target's reply."""

    sender: str
    payload: Any


@dataclass
class GatherSummary:
    """Who did what, once the gather has ended. Every target is in exactly one list (or
    ``errors``); ``ended`` says why it ended: ``want``, ``all`` (every target answered or failed),
    ``timeout`` or ``cancelled``."""

    targets: list[str]
    replied: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # target -> error code
    timed_out: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)  # not waited for: want reached, or cancel
    ended: str = "all"

    def as_dict(self) -> dict[str, Any]:
        return {"targets": self.targets, "replied": self.replied, "errors": self.errors,
                "timed_out": self.timed_out, "unreachable": self.unreachable,
                "cancelled": self.cancelled, "ended": self.ended}


def _subscribes(topics: Any, topic: str) -> bool:
    if not isinstance(topics, list):
        return False
    return any(t == topic or (isinstance(t, str) and T.is_pattern(t) and T.matches(T.split(t), topic))
               for t in topics)


def pick_targets(records: Iterable[Mapping[str, Any]], me: str, *, to: Iterable[str] | None = None,
                 capability: str | None = None, subscribers_of: str | None = None) -> list[str]:
    """The gather's targets: ``to`` as given (deduplicated, in order), or every agent of the
    mesh (not ``me``, not a daemon's system agent) with ``capability``, or subscribing to
    ``subscribers_of`` (exactly or by a pattern). Exactly one of the three."""
    if sum(x is not None for x in (to, capability, subscribers_of)) != 1:
        raise ValidationFailed("gather needs exactly one of to=, capability= or subscribers_of=")
    if to is not None:
        if isinstance(to, str):
            raise ValidationFailed("to= is a list of agent names")
        return list(dict.fromkeys(to))
    names: list[str] = []
    for rec in records:
        name = rec.get("name")
        if not isinstance(name, str) or name == me or name.startswith(SYSTEM_PREFIX):
            continue
        if capability is not None:
            taken = capability in (rec.get("capabilities") or ())
        else:
            taken = _subscribes(rec.get("topics"), str(subscribers_of))
        if taken:
            names.append(name)
    return sorted(set(names))


class Gather:
    """``async for reply in agent.gather(...)``: replies as they come; then ``summary``.

    Iterate it once. ``await g.cancel()`` (or leaving ``async with g``) stops waiting and cancels
    the outstanding requests; ``await g.collect()`` gathers everything and returns the replies and
    the summary."""

    #: None until the gather has ended.
    summary: GatherSummary | None = None

    def __init__(self, agent: Requester, topic: str, payload: Any = None, *,
                 to: Iterable[str] | None = None, capability: str | None = None,
                 subscribers_of: str | None = None, want: int | None = None, timeout: float = 30.0,
                 headers: dict[str, Any] | None = None,
                 on_progress: Callable[[str, str], Any] | None = None, priority: int = 5) -> None:
        if want is not None and want < 1:
            raise ValidationFailed("want must be a positive number of replies")
        if not timeout or timeout <= 0:
            raise ValidationFailed("timeout must be a positive number of seconds")
        if sum(x is not None for x in (to, capability, subscribers_of)) != 1:
            raise ValidationFailed("gather needs exactly one of to=, capability= or subscribers_of=")
        self._agent = agent
        self._topic = topic
        self._payload = payload
        self._select: dict[str, Any] = {"to": None if to is None else list(to), "capability": capability,
                                        "subscribers_of": subscribers_of}
        self.want = want
        self.timeout = timeout
        self._headers = headers
        self._on_progress = on_progress
        self._priority = priority
        self._queue: asyncio.Queue[tuple[str, Any, BaseException | None]] = asyncio.Queue()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._started = False
        self.summary = None
        self._partial = GatherSummary(targets=[])
        self._span: Any = None  # the gather's PRODUCER span when tracing: its requests are under it

    def __aiter__(self) -> Gather:
        return self

    async def __aenter__(self) -> Gather:
        """Send the requests now (iterating would also start them)."""
        if not self._started:
            await self._start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cancel()

    async def _start(self) -> None:
        self._started = True
        t0 = time.monotonic()
        sel = self._select
        records = [] if sel["to"] is not None else await self._agent.agents()
        targets = pick_targets(records, self._agent.name, **sel)
        if len(targets) > GATHER_MAX_TARGETS:
            raise TooLarge(f"gather to {len(targets)} agents; the limit is GATHER_MAX_TARGETS="
                           f"{GATHER_MAX_TARGETS}")
        self._partial.targets = targets
        if (t := tracing.tracer()) is not None:  # one span for the scatter; each request a child
            carried: dict[str, Any] = {"h": self._headers} if self._headers else {}
            self._span = tracing.start_producer(t, "gather", self._topic, self._agent.name,
                                                f"gather-{id(self):x}", carried, "h")
            self._span.set_attribute("messaging.batch.message_count", len(targets))
            self._headers = carried["h"]
        left = self.timeout - (time.monotonic() - t0)
        for name in targets:
            self._tasks[name] = asyncio.ensure_future(self._ask(name, max(left, 0.001)))

    async def _ask(self, name: str, timeout: float) -> None:
        progress = None
        if self._on_progress is not None:
            cb = self._on_progress

            def progress(note: str, name: str = name) -> Any:
                return cb(name, note)
        try:
            value = await self._agent.request(name, self._topic, self._payload, timeout=timeout,
                                              headers=self._headers, on_progress=progress,
                                              priority=self._priority)
        except Exception as exc:  # every failure is one target's outcome, never the gather's
            self._queue.put_nowait((name, None, exc))
        else:
            self._queue.put_nowait((name, value, None))

    def _done(self) -> bool:
        s = self._partial
        return not self._tasks or (self.want is not None and len(s.replied) >= self.want)

    async def __anext__(self) -> GatherReply:
        if self.summary is not None:
            raise StopAsyncIteration
        if not self._started:
            await self._start()
        s = self._partial
        while not self._done():
            try:
                name, value, exc = await self._queue.get()
            except asyncio.CancelledError:
                self._end("cancelled")  # the consuming task was cancelled: so are the requests
                raise
            self._tasks.pop(name, None)
            if exc is None:
                s.replied.append(name)
                return GatherReply(name, value)
            if isinstance(exc, RequestTimeout):
                s.timed_out.append(name)
            elif isinstance(exc, MeshError) and exc.code in UNREACHABLE_CODES:
                s.unreachable.append(name)
            else:
                s.errors[name] = exc.code if isinstance(exc, MeshError) else type(exc).__name__
        await self._finish("want" if self._tasks else "timeout" if s.timed_out else "all")
        raise StopAsyncIteration

    def _end(self, ended: str) -> list[asyncio.Task[None]]:
        """Cancel what is outstanding (its handlers hear the mesh cancel) and fix the summary."""
        s = self._partial
        tasks = list(self._tasks.values())
        s.cancelled.extend(self._tasks)
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        s.ended = ended
        self.summary = s
        if self._span is not None:
            self._span.set_attribute("meshd.gather.replied", len(s.replied))
            self._span.set_attribute("meshd.gather.ended", ended)
            self._span.end()
            self._span = None
        return tasks

    async def _finish(self, ended: str) -> None:
        tasks = self._end(ended)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)  # let their cancels go out

    async def cancel(self) -> None:
        """Stop now: outstanding requests are cancelled and listed in ``summary.cancelled``."""
        if self.summary is None:
            await self._finish("cancelled")

    async def collect(self) -> tuple[list[GatherReply], GatherSummary]:
        """Run the gather to its end: every reply, then the summary."""
        replies = [reply async for reply in self]
        assert self.summary is not None
        return replies, self.summary
