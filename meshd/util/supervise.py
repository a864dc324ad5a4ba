"""Supervised background loops: one bad message never stops a daemon task for good.

Owns: :func:`supervised`, which runs a loop coroutine factory and, if it raises, logs it (with its
traceback once per task and exception type), counts ``task_restarts_<name>`` and starts it again
after a short pause (a TypeError from one malformed qos-1 batch once stopped the
qos-1 retry task silently, so later qos-1 sends were never retried). It must not know what the
loops do; cancelling the task (``Node.stop``) still ends it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from meshd.util.logonce import LogOnce

__all__ = ["RESTART_PAUSE", "supervised"]

log = logging.getLogger("meshd.node")

RESTART_PAUSE = 0.05
"""Seconds between a loop raising and its restart: never a hot loop."""


async def supervised(loop: Callable[[], Awaitable[None]], name: str, stats: Counter[str],
                     quiet: LogOnce) -> None:
    """Run ``loop()`` until it returns; restart it whenever it raises an Exception."""
    while True:
        try:
            await loop()
            return
        except Exception as exc:  # CancelledError is not an Exception: cancelling still stops it
            stats[f"task_restarts_{name}"] += 1
            key = f"task:{name}:{type(exc).__name__}"
            if key not in quiet:
                log.exception("background task %s raised; restarted (logged once per cause)", name)
            quiet.log(key, "task %s restarted", name, level=logging.DEBUG)
            await asyncio.sleep(RESTART_PAUSE)
