"""Calling one plugin's observer hooks off the routing path: the per-plugin queue and its thread.

Owns: :func:`plain` (the copy each plugin gets), :func:`call_impl` (one isolated, timed call of one
hook implementation; shared with the process-mode child in :mod:`meshd.plugins.process`), and
:class:`ThreadWorker` (one bounded queue and one thread per plugin, with its own drop counter).
Must not touch: loading, configuration or the pluggy manager (:mod:`meshd.plugins` owns those),
nor anything of the node.

Accounting keys (passed to the ``count`` callback the host gives every worker): ``called``,
``dropped`` and ``dropped:<plugin>`` (queue full or host closed), ``failed:<plugin>``,
``timed_out:<plugin>``, ``abandoned`` and ``abandoned:<plugin>`` (still queued when the worker
stopped).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any, Final, Protocol

from pluggy import HookImpl

__all__ = ["Counter", "ThreadWorker", "call_impl", "plain"]

log = logging.getLogger("meshd.plugins")

DROP_LOG_EVERY: Final = 1000  # log the first drop, then once per this many
FAIL_LOG_EVERY: Final = 1000  # same for a plugin that fails over and over

_LEAVES: Final = frozenset({str, bytes, int, float, bool, type(None)})

#: (hook name, keyword arguments); None is the worker's stop marker.
Event = tuple[str, dict[str, Any]]


class Counter(Protocol):
    """The host's counting callback: add ``n`` to ``key`` and return the new total."""

    def __call__(self, key: str, n: int = 1) -> int: ...


def plain(value: Any) -> Any:
    """A copy with every mapping turned into a new dict and every list/tuple/set into a new list.

    Plugins run on other threads than the routing loop, and one plugin must not see another's
    edits: each gets its own copy. Leaves (str, bytes, numbers, None) are immutable and shared.
    """
    if type(value) in _LEAVES:  # the common case, checked first: this runs on the routing path
        return value
    if isinstance(value, Mapping):
        copy = dict(value)
        for key, item in copy.items():
            if type(item) not in _LEAVES:
                copy[key] = plain(item)  # replacing a value while iterating is fine
        return copy
    if isinstance(value, list | tuple | set | frozenset):
        return [item if type(item) in _LEAVES else plain(item) for item in value]
    return value


def call_impl(loop: asyncio.AbstractEventLoop, plugin: str, impl: HookImpl, hook: str,
              kwargs: Mapping[str, Any], timeout: float, count: Counter) -> None:
    """Call one implementation with its own copy of the arguments; never raises.

    An awaitable result is run to completion in ``loop`` within ``timeout`` seconds. Exceptions
    count ``failed:<plugin>``, time-outs ``timed_out:<plugin>``; both are logged the first time and
    then once per 1,000.
    """
    count("called")
    try:
        result = impl.function(*[plain(kwargs[arg]) for arg in impl.argnames])
        if inspect.isawaitable(result):
            loop.run_until_complete(asyncio.wait_for(result, timeout))
    except TimeoutError:
        n = count(f"timed_out:{plugin}")
        if n == 1 or n % FAIL_LOG_EVERY == 0:
            log.warning("plugin %s timed out in %s after %.1f s (%d timeouts so far)",
                        plugin, hook, timeout, n)
    except BaseException:  # includes SystemExit/CancelledError raised by a plugin
        n = count(f"failed:{plugin}")
        if n == 1 or n % FAIL_LOG_EVERY == 0:
            log.exception("plugin %s raised in %s (%d failures so far)", plugin, hook, n)


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what a plugin left running in ``loop`` and close it; never raises."""
    try:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except BaseException:
        log.debug("plugin worker loop cleanup failed", exc_info=True)
    finally:
        loop.close()


SLOW_CALL_CPU_S = 0.005
"""A thread-mode observer call that holds the CPU this long (its thread's CPU time) slows the
routing loop, which needs the same interpreter: warned about, naming the plugin."""


class ThreadWorker:
    """One plugin's observer hooks, called on a thread of its own from a bounded queue of its own.

    A plugin that blocks fills only its own queue: the others keep receiving every event. The
    routing loop calls :meth:`offer`, which never blocks and never raises.
    """

    isolation: Final = "thread"

    def __init__(self, name: str, impls: Mapping[str, list[HookImpl]], *, queue_size: int,
                 hook_timeout: float, count: Counter) -> None:
        self.name = name
        #: hook name -> this plugin's implementations of it (normally one).
        self.impls = dict(impls)
        self.hook_timeout = hook_timeout
        self._count = count
        self._queue: queue.Queue[Event | None] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._abandon = threading.Event()
        #: hook -> [calls, wall seconds, CPU seconds of this thread] (written by its thread only).
        self.hook_time: dict[str, list[float]] = {}
        self._slow_warned = 0

    @property
    def queue_size(self) -> int:
        return self._queue.maxsize

    @property
    def queued(self) -> int:
        """Events waiting for this plugin (approximate)."""
        return self._queue.qsize()

    def offer(self, hook: str, kwargs: dict[str, Any]) -> None:
        """Queue one event for this plugin, or drop and count it if the queue is full or closed."""
        if self._closing.is_set():
            self._drop()
            return
        try:
            self._queue.put_nowait((hook, kwargs))
        except queue.Full:
            self._drop()

    def _drop(self) -> None:
        self._count("dropped")
        dropped = self._count(f"dropped:{self.name}")
        if dropped % DROP_LOG_EVERY == 1:
            log.warning("plugin %s: its queue is full (%d events); %d events dropped for it so far",
                        self.name, self._queue.maxsize, dropped)

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"worker of plugin {self.name} started twice")
        self._thread = threading.Thread(target=self._run, name=f"meshd-plugin-{self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Accept no more events (later offers are dropped and counted)."""
        self._closing.set()

    def stop(self, deadline: float) -> bool:
        """Deliver what is queued until ``deadline`` (time.monotonic), then end the thread.

        Returns whether the thread ended. One still busy at the deadline is left to finish its
        current call (a daemon thread) and what is queued is abandoned (counted).
        """
        self._closing.set()
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._abandon_queued()
            return True
        try:
            self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        thread.join(max(0.0, deadline - time.monotonic()))
        if not thread.is_alive():
            return True
        self._abandon.set()
        waiting = self._abandon_queued()
        try:
            self._queue.put_nowait(None)  # wake the worker if it drained everything meanwhile
        except queue.Full:
            pass
        log.warning("plugin %s still busy at shutdown; abandoned %d queued events", self.name, waiting)
        return False

    def _abandon_queued(self) -> int:
        abandoned = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                abandoned += 1
        if abandoned:
            self._count("abandoned", abandoned)
            self._count(f"abandoned:{self.name}", abandoned)
        return abandoned

    def _timed(self, hook: str, wall: float, cpu: float) -> None:
        spent = self.hook_time.get(hook)
        if spent is None:
            spent = self.hook_time[hook] = [0, 0.0, 0.0]
        spent[0] += 1
        spent[1] += wall
        spent[2] += cpu
        if cpu >= SLOW_CALL_CPU_S:
            n = self._count(f"slow:{self.name}")
            if n == 1 or n % FAIL_LOG_EVERY == 0:
                log.warning("plugin %s held the CPU %.1f ms in one %s call on its thread (%d slow calls "
                            "so far): a thread-mode plugin shares the interpreter with routing and slows "
                            "it; run it in a process of its own: [plugins.%s] isolation = \"process\"",
                            self.name, cpu * 1000, hook, n, self.name)

    def hook_times(self) -> dict[str, dict[str, float]]:
        """Per hook: calls, seconds and cpu_seconds spent in this plugin's implementations."""
        return {hook: {"calls": int(c), "seconds": round(w, 6), "cpu_seconds": round(u, 6)}
                for hook, (c, w, u) in list(self.hook_time.items())}

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            while not self._abandon.is_set():
                item = self._queue.get()
                if item is None:
                    break
                hook, kwargs = item
                for impl in self.impls.get(hook, ()):
                    if self._abandon.is_set():
                        break
                    started, cpu = time.perf_counter(), time.thread_time()
                    call_impl(loop, self.name, impl, hook, kwargs, self.hook_timeout, self._count)
                    self._timed(hook, time.perf_counter() - started, time.thread_time() - cpu)
        finally:
            self._abandon_queued()
            close_loop(loop)
