"""The client's qos-0 resend hold across a daemon restart, and the re-registration that ends it.

Owns: the last ``RESEND_WINDOW`` qos-0 sends (bounded by count and by bytes), the sends a
restarted daemon refused with NOT_REGISTERED (held, at most ``RESEND_WINDOW``, until the agent
has registered again), and the re-registration loop with its jittered backoff.

Must not touch: the socket, the batcher's queues, the futures of pending calls, the handler
table. It sends again and reports through the callbacks the ``Agent`` (meshd/client.py) gives
it; the ``Agent`` owns it (composition).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from .backoff import backoff_delay
from .batching import BatchKey
from .errors import DaemonUnreachable, MeshError, RequestTimeout

log = logging.getLogger("meshd.client")

REREGISTER_ATTEMPTS = 5
"""Tries to register again after the daemon forgot this agent (it restarted), with jittered backoff."""
RESEND_WINDOW = 1000
RESEND_WINDOW_BYTES = 8 * 1024 * 1024
"""The last qos-0 sends (at most this many and bytes) kept so that one the daemon refused with
NOT_REGISTERED (it restarted and forgot this agent) is sent again after registering again."""

SentItem = tuple[BatchKey, dict[str, Any], bytes]
"""A qos-0 send as it was enqueued: its batch key, header and encoded payload."""


class ResendHold:
    """Recent qos-0 sends, the ones a restarted daemon refused, and the re-registration."""

    def __init__(self, name: str, *, enqueue: Callable[[BatchKey, dict[str, Any], bytes], None],
                 report: Callable[[MeshError, str], None]) -> None:
        self.name = name
        self._enqueue = enqueue
        self._report = report
        self.recent: OrderedDict[str, SentItem] = OrderedDict()
        self.recent_bytes = 0
        self.held: list[tuple[str, SentItem]] = []
        self.reregistering = False

    def remember(self, msg_id: str, item: SentItem) -> None:
        """Keep a qos-0 send for a while: if the daemon refuses it NOT_REGISTERED, it goes again."""
        self.recent[msg_id] = item
        self.recent_bytes += len(item[2])
        while len(self.recent) > RESEND_WINDOW or self.recent_bytes > RESEND_WINDOW_BYTES:
            _, old = self.recent.popitem(last=False)
            self.recent_bytes -= len(old[2])

    def hold(self, targets: list[Any]) -> list[Any]:
        """Hold the refused qos-0 sends we still have (sent again after registering again);
        return the targets we cannot send again (they are reported)."""
        rest = []
        for target in targets:
            item = self.recent.pop(str(target), None) if target is not None else None
            if item is None or len(self.held) >= RESEND_WINDOW:
                rest.append(target)
                continue
            self.recent_bytes -= len(item[2])
            self.held.append((str(target), item))
        return rest

    def release(self, err: MeshError | None) -> None:
        """Registered again: send what was held (``err`` None), or report each one (``err``)."""
        held, self.held = self.held, []
        for msg_id, (key, header, data) in held:
            if err is None:
                self._enqueue(key, header, data)
                self.remember(msg_id, (key, header, data))
            else:
                self._report(err, msg_id)
        if held and err is None:
            log.info("agent %s sent again %d message(s) its restarted daemon had refused", self.name,
                     len(held))

    async def reregister(self, register: Callable[[], Awaitable[None]],
                         closed: Callable[[], bool]) -> None:
        """Register again (``register`` also restores the subscriptions), then release the hold.
        The caller sets ``reregistering`` before it spawns this, so only one runs at a time."""
        try:
            for attempt in range(1, REREGISTER_ATTEMPTS + 1):
                try:
                    await register()
                    log.info("agent %s registered again after a daemon restart", self.name)
                    self.release(None)
                    return
                except (DaemonUnreachable, RequestTimeout) as exc:
                    if attempt == REREGISTER_ATTEMPTS or closed():
                        log.warning("agent %s could not register again: %s", self.name, exc)
                        self.release(exc)
                        return
                    await asyncio.sleep(backoff_delay(attempt, 0.2, 5.0))
                except MeshError as exc:  # NAME_TAKEN and the like: trying again will not help
                    log.warning("agent %s could not register again: %s", self.name, exc)
                    self.release(exc)
                    return
        finally:
            self.reregistering = False
