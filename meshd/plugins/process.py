"""Process isolation for one plugin: a supervised child process fed through a bounded queue.

Owns: :class:`ProcessWorker` (the parent side: the bounded ``multiprocessing`` queue the routing
loop offers events to, the supervisor thread that merges the child's counters and restarts it with
:func:`meshd.util.backoff.backoff_delay` when it dies) and :class:`NodeSnapshot` (the picklable
:class:`meshd.view.NodeView` the child's lifecycle hooks get). The child itself is
meshd/plugins/child.py. Must not touch: the pluggy manager of the daemon or the node itself.

Why: a CPU-bound hook on a thread competes with routing for the interpreter lock; in a child
process it only competes for a core. The cost is pickling every event across the pipe.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from meshd.plugins.workers import DROP_LOG_EVERY, Counter, Event
from meshd.util.backoff import backoff_delay
from meshd.view import MetricsSnapshot

if TYPE_CHECKING:  # imported when the first isolation = "process" plugin starts (_spawn)
    import multiprocessing.context
    import multiprocessing.process
    import multiprocessing.queues

__all__ = ["NodeSnapshot", "ProcessWorker"]

log = logging.getLogger("meshd.plugins")

_RESULTS_SIZE: Final = 64  # counter deltas in flight from the child; deltas merge while it is full
_RESTART_BASE: Final = 0.5
_RESTART_CAP: Final = 30.0
_STABLE_AFTER: Final = 60.0  # a child that lived this long restarts from the first back-off step


def _spawn() -> multiprocessing.context.SpawnContext:
    """multiprocessing's spawn context (no fork of a process with zmq and threads), imported when
    the first ``isolation = "process"`` plugin starts, not by every daemon."""
    import multiprocessing

    return multiprocessing.get_context("spawn")


@dataclass(frozen=True)
class NodeSnapshot:
    """The node as it was when the plugin's child started: a :class:`meshd.view.NodeView` whose
    methods return copies taken then (a child process cannot read the live node)."""

    node_id: str
    name: str
    mesh: str
    info_at_start: dict[str, Any] = field(default_factory=dict)
    agents_at_start: list[dict[str, Any]] = field(default_factory=list)
    peers_at_start: list[dict[str, Any]] = field(default_factory=list)
    dead_letters_at_start: list[dict[str, Any]] = field(default_factory=list)
    metrics_at_start: MetricsSnapshot | None = None

    def metrics_snapshot(self) -> MetricsSnapshot:
        return self.metrics_at_start or MetricsSnapshot(self.node_id, self.name, self.mesh, 0.0)

    def info(self) -> dict[str, Any]:
        return dict(self.info_at_start)

    def agents(self) -> list[dict[str, Any]]:
        return [dict(a) for a in self.agents_at_start]

    def peers(self) -> list[dict[str, Any]]:
        return [dict(p) for p in self.peers_at_start]

    def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        kept = self.dead_letters_at_start
        return [dict(d) for d in kept[max(len(kept) - limit, 0):]] if limit > 0 else []


class ProcessWorker:
    """One plugin run in a child process; same interface as :class:`ThreadWorker`.

    ``spec`` is what the child imports: ``"module"`` or ``"module:attribute"``.
    """

    isolation: Final = "process"

    def __init__(self, name: str, spec: str, hooks: frozenset[str], *, section: Mapping[str, Any],
                 queue_size: int, hook_timeout: float, count: Counter) -> None:
        self.name = name
        self.spec = spec
        self.hooks = hooks
        self.section = dict(section)
        self.hook_timeout = hook_timeout
        self.queue_size = queue_size
        self.node: NodeSnapshot | None = None
        self._count = count
        self._events: multiprocessing.queues.Queue[Event | None] = _spawn().Queue(queue_size)
        self._results: multiprocessing.queues.Queue[dict[str, int]] = _spawn().Queue(_RESULTS_SIZE)
        self._proc: multiprocessing.process.BaseProcess | None = None
        self._supervisor: threading.Thread | None = None
        self._closing = threading.Event()
        self._stopped = threading.Event()
        self.restarts = 0

    @property
    def queued(self) -> int:
        try:
            return self._events.qsize()
        except NotImplementedError:  # pragma: no cover - macOS
            return 0

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def offer(self, hook: str, kwargs: dict[str, Any]) -> None:
        """Queue one event for the child, or drop and count it; never blocks (pickling happens on
        the queue's feeder thread)."""
        if self._closing.is_set():
            self._drop()
            return
        try:
            self._events.put_nowait((hook, kwargs))
        except queue.Full:
            self._drop()
        except Exception:  # a closed queue during a restart
            self._drop()

    def _drop(self) -> None:
        self._count("dropped")
        dropped = self._count(f"dropped:{self.name}")
        if dropped % DROP_LOG_EVERY == 1:
            log.warning("plugin %s (process): its queue is full (%d events); %d events dropped so far",
                        self.name, self.queue_size, dropped)

    def start(self) -> None:
        if self._supervisor is not None:
            raise RuntimeError(f"worker of plugin {self.name} started twice")
        self._spawn()
        self._supervisor = threading.Thread(target=self._supervise, name=f"meshd-plugin-{self.name}",
                                            daemon=True)
        self._supervisor.start()

    def close(self) -> None:
        self._closing.set()

    def _spawn(self) -> None:
        proc = _spawn().Process(
            target=_run_child, name=f"meshd-plugin-{self.name}", daemon=True,
            args=(self.name, self.spec, self.section, self.node, self.hook_timeout, self._events,
                  self._results, os.getpid()),
        )
        proc.start()
        self._proc = proc
        log.info("plugin %s runs in child process %d", self.name, proc.pid)

    def _merge_results(self, timeout: float) -> None:
        try:
            delta = self._results.get(timeout=timeout)
        except (queue.Empty, OSError, EOFError, ValueError):
            return
        while True:
            for key, n in delta.items():
                self._count(key, n)
            try:
                delta = self._results.get_nowait()
            except (queue.Empty, OSError, EOFError, ValueError):
                return

    def _supervise(self) -> None:
        attempt = 0
        started = time.monotonic()
        while not self._stopped.is_set():
            self._merge_results(0.1)
            proc = self._proc
            if proc is None or proc.is_alive() or self._stopped.is_set():
                continue
            if self._closing.is_set():
                return
            # The child died. Its queues may be left locked or half-written: replace both, and count
            # what was waiting in the old one as lost.
            self._merge_results(0.0)
            lost = self.queued
            old_events, old_results = self._events, self._results
            self._events = _spawn().Queue(self.queue_size)
            self._results = _spawn().Queue(_RESULTS_SIZE)
            for q in (old_events, old_results):
                q.cancel_join_thread()
                q.close()
            if lost:
                self._count(f"lost:{self.name}", lost)
            self._count(f"restarted:{self.name}")
            attempt = 1 if time.monotonic() - started > _STABLE_AFTER else attempt + 1
            delay = backoff_delay(attempt, _RESTART_BASE, _RESTART_CAP)
            log.error("plugin %s: child process %s exited with %s; %d queued events lost; "
                      "restarting in %.1f s", self.name, proc.pid, proc.exitcode, lost, delay)
            if self._stopped.wait(delay) or self._closing.is_set():
                return
            self.restarts += 1
            started = time.monotonic()
            self._spawn()

    def stop(self, deadline: float, node: NodeSnapshot | None = None) -> bool:
        """Queue ``meshd_shutdown`` (when ``node`` is given) and the end marker, let the child
        deliver what is queued until ``deadline``, then end it (SIGTERM, then SIGKILL).

        Returns whether the child ended by itself in time.
        """
        self._closing.set()
        proc = self._proc
        clean = True
        if proc is not None and proc.is_alive():
            with contextlib.suppress(queue.Full, ValueError, OSError):
                if node is not None:
                    self._events.put(("meshd_shutdown", {"node": node}),
                                     timeout=max(0.0, deadline - time.monotonic()))
                self._events.put(None, timeout=max(0.0, deadline - time.monotonic()))
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                clean = False
                abandoned = self.queued
                if abandoned:
                    self._count("abandoned", abandoned)
                    self._count(f"abandoned:{self.name}", abandoned)
                log.warning("plugin %s: child process %d still busy at shutdown; terminating it",
                            self.name, proc.pid)
                proc.terminate()
                proc.join(1.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(1.0)
        self._stopped.set()
        if self._supervisor is not None:
            self._supervisor.join(2.0)
        self._merge_results(0.0)
        for q in (self._events, self._results):
            q.cancel_join_thread()
            q.close()
        if proc is not None:
            with contextlib.suppress(ValueError):
                proc.close()
        return clean


# -- the child --------------------------------------------------------------------------------------


CHILD_MODULE: Final = "meshd.plugins.child"
"""Where the child's entry lives. It builds its own ``PluginHost``, and meshd/plugins/host.py imports
this module, so the child's module is named here and imported in the child only (no import cycle)."""


def _run_child(*args: Any) -> None:
    """The child process's entry (what ``multiprocessing`` starts): hands over to ``child_main``."""
    importlib.import_module(CHILD_MODULE).child_main(*args)
