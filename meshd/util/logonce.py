"""Log a repeated condition once, with a bounded memory of what was logged.

Garbage traffic must not flood the log (python-zeroconf's ``QuietLogger``): the first occurrence of
a condition is logged at the given level, repeats are counted silently. Keys often come from peers
(ids, names), so the set of remembered keys is bounded: past ``capacity`` the oldest is forgotten
(it may then be logged again, which is the safe direction).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

__all__ = ["LogOnce"]


class LogOnce:
    """Remembers up to ``capacity`` keys; ``log`` emits only for a key not seen (or ``forget``-ed)."""

    def __init__(self, logger: logging.Logger, capacity: int = 1024) -> None:
        self._logger = logger
        self._capacity = capacity
        self._seen: OrderedDict[str, int] = OrderedDict()
        #: Messages suppressed because their key was already logged.
        self.suppressed = 0

    def log(self, key: str, msg: str, *args: object, level: int = logging.WARNING) -> bool:
        """Log ``msg % args`` unless ``key`` was logged already; return whether it was logged."""
        if key in self._seen:
            self._seen[key] += 1
            self.suppressed += 1
            return False
        self._seen[key] = 0
        if len(self._seen) > self._capacity:
            self._seen.popitem(last=False)
        self._logger.log(level, msg, *args)
        return True

    def forget(self, key: str) -> None:
        """The condition cleared (a peer came back, a file became readable): log it again next time."""
        self._seen.pop(key, None)

    def clear(self) -> None:
        self._seen.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._seen
