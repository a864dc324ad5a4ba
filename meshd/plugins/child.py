"""The child process of a plugin with ``isolation = "process"`` (the parent side is meshd/plugins/process.py).

Owns: :func:`child_main`, which imports the plugin again, calls ``meshd_configure`` and
``meshd_startup``, then the observer hooks the parent sends through the queue, then
``meshd_shutdown``, and sends its counters back. It builds its own :class:`PluginHost`, so the
loading, configuration and isolated calls are those of the daemon's host.

The child never outlives the daemon: it asks the kernel for SIGKILL when its parent dies
(``PR_SET_PDEATHSIG``), and also checks its parent id whenever its queue is idle for a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import logging
import multiprocessing.queues
import os
import queue
import signal
from collections import Counter as _Counter
from collections.abc import Mapping
from typing import Any, Final

from meshd.plugins.host import PluginHost
from meshd.plugins.process import NodeSnapshot
from meshd.plugins.workers import Event, call_impl, close_loop

__all__ = ["child_main"]

_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _import_spec(spec: str) -> object:
    module_name, _, attr = spec.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def child_main(name: str, spec: str, section: dict[str, Any], node: NodeSnapshot | None,
               hook_timeout: float, events: multiprocessing.queues.Queue[Event | None],
               results: multiprocessing.queues.Queue[dict[str, int]], parent_pid: int) -> None:
    """Run plugin ``name`` in this (child) process until the end marker or the parent's death."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the daemon, which stops us
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s plugin {name}[%(process)d] %(message)s")
    # The child's own host: the same loading, configuration (meshd_configure) and isolated calls.
    host = PluginHost(load_entrypoints=False, environ={}, hook_timeout=hook_timeout,
                              sections={name: section})
    sent: _Counter[str] = _Counter()

    def flush(block: bool = False) -> None:
        """Send the host's counts not sent yet; when the pipe is full they wait for the next try."""
        delta = host.stats - sent
        if not delta:
            return
        try:
            if block:
                results.put(dict(delta), timeout=2.0)
            else:
                results.put_nowait(dict(delta))
        except (queue.Full, ValueError, OSError):
            return
        sent.update(delta)

    loop = asyncio.new_event_loop()

    def call(hook: str, kwargs: Mapping[str, Any]) -> None:
        for impl in reversed(getattr(host.pm.hook, hook).get_hookimpls()):
            if not (impl.wrapper or impl.hookwrapper):
                call_impl(loop, name, impl, hook, kwargs, hook_timeout, host.count)

    try:
        host.register(_import_spec(spec), name=name)  # validates the section, calls meshd_configure
        if node is not None:
            call("meshd_startup", {"node": node})
        flush()
        while True:
            try:
                item = events.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent_pid:
                    return  # the daemon is gone
                flush()
                continue
            if item is None:
                break
            hook, kwargs = item
            call(hook, kwargs)
            flush()
    finally:
        flush(block=True)
        close_loop(loop)
