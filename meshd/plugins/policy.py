"""Who may do what with tools: approval of calls with side effects, per-agent quotas, authorization.

Owns three small, socket-free parts the system agent (:mod:`meshd.tools.service`) consults before a
handler runs:

* :class:`Approvals`: the approval decision (a plugin's answer first, else the config policy per
  tool) and the bounded table of calls held for a person (``meshctl approvals``);
* :class:`Quotas`: tool calls per agent per minute, unfinished tasks per agent, live spawned
  agents per agent;
* :class:`Authorizer`: the ``meshd_authorize`` verdict, cached (bounded, short-lived), for tools,
  messages and approvals; this is also the function a routing path would call.

Must not touch the registry, the node or the client: it gets plain values and callables.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from meshd.errors import ApprovalDenied, Forbidden, NoSuchApproval, QueueFull, QuotaExceeded

if TYPE_CHECKING:
    from meshd.config.settings import ToolsSettings

__all__ = ["Approvals", "Authorizer", "HeldCall", "Quotas", "parse_decision"]

ALLOW: Final = "allow"
DENY: Final = "deny"
HOLD: Final = "hold"


def parse_decision(value: Any) -> tuple[str, str] | None:
    """An approval hook's answer as ``(decision, reason)``, or None for "no opinion".

    Accepted: ``"allow"``, ``"hold"``, ``"deny"``, ``"deny: <reason>"`` (and True/False for
    allow/deny). Anything else is a deny naming the bad answer: a broken policy must not let
    calls through.
    """
    if value is None:
        return None
    if value is True:
        return ALLOW, ""
    if value is False:
        return DENY, "denied by an approval plugin"
    if isinstance(value, str):
        word, _, reason = value.partition(":")
        word = word.strip().lower()
        if word in (ALLOW, HOLD):
            return word, ""
        if word == DENY:
            return DENY, reason.strip() or "denied by an approval plugin"
    return DENY, f"an approval plugin gave an answer meshd does not understand: {value!r}"


@dataclass(slots=True)
class HeldCall:
    """A tool call waiting for a person's decision."""

    id: str
    tool: str
    caller: str
    args: dict[str, Any]
    at: float
    decision: asyncio.Future[tuple[bool, str, str]] = field(repr=False)

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "tool": self.tool, "caller": self.caller, "args": self.args, "at": self.at}


class Approvals:
    """The approval policy and the held calls (at most ``settings.max_held`` at once)."""

    def __init__(self, settings: ToolsSettings) -> None:
        self.settings = settings
        self.held: dict[str, HeldCall] = {}
        self._ids = itertools.count(1)
        self._prefix = os.urandom(2).hex()

    def policy(self, tool: str, plugin_answer: Any) -> tuple[str, str]:
        """``(decision, reason)`` for a call of ``tool``: the plugin's answer when it gave one,
        else the config's policy for that tool, else ``default_approval``."""
        parsed = parse_decision(plugin_answer)
        if parsed is not None:
            return parsed
        word = self.settings.approval.get(tool, self.settings.default_approval)
        return word, (f"tool {tool!r} is denied by the daemon's config" if word == DENY else "")

    def hold(self, tool: str, caller: str, args: dict[str, Any]) -> HeldCall:
        """Put a call on hold; :class:`QueueFull` when ``max_held`` calls wait already."""
        if len(self.held) >= self.settings.max_held:
            raise QueueFull(f"{len(self.held)} tool calls already wait for approval (max_held); "
                            "try again later")
        loop = asyncio.get_running_loop()
        call = HeldCall(f"{self._prefix}-{next(self._ids)}", tool, caller, args, time.time(),
                        loop.create_future())
        self.held[call.id] = call
        return call

    async def wait(self, call: HeldCall, timeout: float) -> str:
        """Wait for the decision on ``call``; returns who allowed it, or raises
        :class:`ApprovalDenied` (denied, or no decision within ``timeout``)."""
        try:
            allowed, by, reason = await asyncio.wait_for(asyncio.shield(call.decision), max(timeout, 0.0))
        except TimeoutError:
            raise ApprovalDenied(f"tool {call.tool!r}: no decision within {timeout:.1f} s "
                                 f"(approval {call.id} timed out)") from None
        finally:
            self.held.pop(call.id, None)
        if not allowed:
            raise ApprovalDenied(f"tool {call.tool!r}: denied by {by}" + (f": {reason}" if reason else ""))
        return by

    def list(self) -> list[dict[str, Any]]:
        return [c.summary() for c in self.held.values()]

    def decide(self, approval_id: Any, allow: bool, by: str, reason: str = "") -> dict[str, Any]:
        """Allow or deny a held call. An agent cannot decide its own call (:class:`Forbidden`)."""
        call = self.held.get(approval_id) if isinstance(approval_id, str) else None
        if call is None or call.decision.done():
            raise NoSuchApproval(f"no held tool call {approval_id!r} (decided, timed out or never held)")
        if by == call.caller:
            raise Forbidden(f"agent {by!r} cannot decide its own held call {call.id}")
        call.decision.set_result((allow, by, reason))
        return call.summary() | {"decision": ALLOW if allow else DENY, "by": by}


class Quotas:
    """Per-agent limits on tool calls; each check raises :class:`QuotaExceeded` naming the limit."""

    WINDOW: Final = 60.0

    def __init__(self, settings: ToolsSettings, max_agents: int = 10_000) -> None:
        self.settings = settings
        self.max_agents = max_agents
        self._calls: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()
        self.tasks_owned: dict[str, set[str]] = {}
        self.spawned: dict[str, list[str]] = {}

    def count_call(self, caller: str, now: float) -> None:
        """Count one call by ``caller``; refuse it past ``calls_per_minute`` in the last 60 s."""
        limit = self.settings.calls_per_minute
        window = self._calls.get(caller)
        if window is None:
            window = collections.deque(maxlen=limit)
            self._calls[caller] = window
            while len(self._calls) > self.max_agents:  # bounded: forget the longest-idle agent
                self._calls.popitem(last=False)
        self._calls.move_to_end(caller)
        while window and now - window[0] >= self.WINDOW:
            window.popleft()
        if len(window) >= limit:
            retry = self.WINDOW - (now - window[0])
            raise QuotaExceeded(f"agent {caller!r} made {limit} tool calls in the last minute "
                                f"(calls_per_minute); retry in {retry:.1f} s", retry_after=round(retry, 3))
        window.append(now)

    def check_tasks(self, caller: str, adding: int, is_open: Callable[[str], bool]) -> None:
        """Refuse ``adding`` more tasks when the caller would own more than ``max_concurrent_tasks``
        unfinished ones (``is_open(task_id)`` says whether a task is still unfinished)."""
        owned = self.tasks_owned.setdefault(caller, set())
        for task_id in [t for t in owned if not is_open(t)]:
            owned.discard(task_id)
        limit = self.settings.max_concurrent_tasks
        if len(owned) + adding > limit:
            raise QuotaExceeded(f"agent {caller!r} owns {len(owned)} unfinished tasks; {adding} more "
                                f"would pass max_concurrent_tasks ({limit})")

    def add_tasks(self, caller: str, task_ids: list[str]) -> None:
        self.tasks_owned.setdefault(caller, set()).update(task_ids)

    def check_spawn(self, caller: str, is_alive: Callable[[str], bool]) -> None:
        """Refuse a spawn when the caller already has ``max_spawned`` live children."""
        live = [name for name in self.spawned.get(caller, []) if is_alive(name)]
        self.spawned[caller] = live
        limit = self.settings.max_spawned
        if len(live) >= limit:
            raise QuotaExceeded(f"agent {caller!r} has {len(live)} spawned agents running "
                                f"(max_spawned = {limit})")

    def add_spawn(self, caller: str, name: str) -> None:
        self.spawned.setdefault(caller, []).append(name)


AskAuthorize = Callable[[str, str, str, "str | None"], Any]


class Authorizer:
    """The ``meshd_authorize`` verdict, cached for ``ttl`` seconds (at most ``capacity`` entries).

    ``check(action, subject, target, topic)`` returns None when allowed, else the reason. Actions:
    ``"tool"`` (subject calls tool ``target``), ``"message"`` (subject sends to agent ``target`` on
    ``topic``), ``"approve"`` (subject decides held call ``target``). With no plugin implementing
    the hook (``ask`` is None) everything is allowed at no cost, so a routing path may call it.
    """

    def __init__(self, ask: AskAuthorize | None, *, capacity: int = 4096, ttl: float = 5.0) -> None:
        self.ask = ask
        self.capacity = capacity
        self.ttl = ttl
        self._cache: collections.OrderedDict[tuple[str, str, str, str | None], tuple[float, str | None]] = (
            collections.OrderedDict())

    def check(self, action: str, subject: str, target: str, topic: str | None = None) -> str | None:
        if self.ask is None:
            return None
        key = (action, subject, target, topic)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        answer = self.ask(action, subject, target, topic)
        if answer is None or answer is True:
            reason: str | None = None
        elif isinstance(answer, str) and answer:
            reason = answer
        else:
            reason = "refused by the authorization policy"
        self._cache[key] = (now + self.ttl, reason)
        self._cache.move_to_end(key)
        while len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return reason

    def require(self, action: str, subject: str, target: str, topic: str | None = None) -> None:
        """:meth:`check`, raising :class:`Forbidden` with the reason when refused."""
        reason = self.check(action, subject, target, topic)
        if reason is not None:
            what = {"tool": f"call tool {target!r}", "message": f"message {target!r} on {topic!r}",
                    "approve": f"decide approval {target!r}"}.get(action, f"{action} {target!r}")
            raise Forbidden(f"agent {subject!r} may not {what}: {reason}")

    def clear(self) -> None:
        self._cache.clear()
