"""The plugin host: loads meshd plugins and calls their hooks without letting them hurt routing.

:class:`PluginHost` is a typed facade over a pluggy ``PluginManager`` (project ``meshd``, specs in
:mod:`meshd.hookspecs`), with one method per hook, so the core never calls ``pm.hook.*`` itself.

Loading (:meth:`PluginHost.load`): every entry point of the ``meshd`` group, then each module named
in the config. Each plugin loads on its own: one that fails to import or register is logged with
its name and counted (``load_failed:<name>``), and the others still load (pluggy's own entry-point
loader stops at the first failure). Names listed in ``MESHD_BLOCKED_PLUGINS`` (comma-separated) are
blocked before anything is imported.

Calling: pluggy stops a hook call at the first exception, so the host calls each implementation on
its own and isolates it.

* Observers and sinks (dead letters, collaboration outcomes, peer and agent state): the routing
  loop only puts the event on a bounded queue (``put_nowait``) and returns; one worker thread with
  its own asyncio loop calls the plugins. A full queue drops the event and counts ``dropped``
  (logged once per 1000 drops); the caller is never blocked and never sees an exception. A plugin
  that sleeps only delays the worker thread.
* Lifecycle (startup, shutdown): awaited in the node's loop, one plugin at a time.

An awaitable returned by a plugin is awaited with ``hook_timeout``; timeouts count
``timed_out:<plugin>``, exceptions ``failed:<plugin>``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import importlib
import importlib.metadata
import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import pluggy

from . import hookspecs

__all__ = ["BLOCKED_ENV", "ENTRYPOINT_GROUP", "OBSERVER_HOOKS", "PluginHost"]

log = logging.getLogger("meshd.plugins")

#: Environment variable naming plugins not to load (comma-separated entry-point or module names).
BLOCKED_ENV: Final = "MESHD_BLOCKED_PLUGINS"
#: The entry-point group third-party distributions register their plugin under.
ENTRYPOINT_GROUP: Final = hookspecs.PROJECT
#: Hooks called on the worker thread through the queue.
OBSERVER_HOOKS: Final = ("meshd_dead_letter", "meshd_collaboration", "meshd_peer_state", "meshd_agent_state")

_DROP_LOG_EVERY = 1000  # log the first drop, then once per this many
_FAIL_LOG_EVERY = 1000  # same for a plugin that fails over and over

_Event = tuple[str, dict[str, Any]]


_LEAVES: Final = frozenset({str, bytes, int, float, bool, type(None)})


def _plain(value: Any) -> Any:
    """A copy with every mapping turned into a new dict and every list/tuple/set into a new list.

    Plugins run on another thread than the routing loop, and one plugin must not see another's
    edits: each gets its own copy. Leaves (str, bytes, numbers, None) are immutable and shared.
    """
    if type(value) in _LEAVES:  # the common case, checked first: this runs on the routing path
        return value
    if isinstance(value, Mapping):
        copy = dict(value)
        for key, item in copy.items():
            if type(item) not in _LEAVES:
                copy[key] = _plain(item)  # replacing a value while iterating is fine
        return copy
    if isinstance(value, list | tuple | set | frozenset):
        return [item if type(item) in _LEAVES else _plain(item) for item in value]
    return value


def _describe(plugin: object) -> str:
    """The import path of a plugin: its module name, or ``module.Class`` for an instance."""
    if inspect.ismodule(plugin):
        return plugin.__name__
    cls = type(plugin)
    return f"{cls.__module__}.{cls.__qualname__}"


class PluginHost:
    """Loads plugins and calls their hooks, one typed method per hook.

    Lifecycle, as the node drives it: ``load()`` (and ``register()`` for built-ins), ``start()``
    the worker thread, ``await startup(node)``; at the end ``await shutdown(node)`` and
    ``stop()``. The four observer methods may be called at any time from the routing loop; events
    put before ``start()`` wait in the queue, events after ``stop()`` are dropped.
    """

    def __init__(
        self,
        modules: Sequence[str] = (),
        *,
        load_entrypoints: bool = True,
        queue_size: int = 10_000,
        hook_timeout: float = 5.0,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, not {queue_size}")
        if not hook_timeout > 0:
            raise ValueError(f"hook_timeout must be positive, not {hook_timeout}")
        self.modules: tuple[str, ...] = tuple(modules)
        self.load_entrypoints = load_entrypoints
        self.hook_timeout = hook_timeout
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.stats: collections.Counter[str] = collections.Counter()
        #: name -> "ExcType: message" for each plugin that failed to load.
        self.load_errors: dict[str, str] = {}
        self._dists: dict[str, str] = {}
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Event | None] = queue.Queue(queue_size)
        self._wanted: frozenset[str] = frozenset()
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._abandon = threading.Event()
        env = os.environ if environ is None else environ
        self.blocked: tuple[str, ...] = tuple(
            name.strip() for name in env.get(BLOCKED_ENV, "").split(",") if name.strip()
        )
        for name in self.blocked:
            self.pm.set_blocked(name)

    # -- loading --------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the ``meshd`` entry points (if enabled), then each configured module; never raises."""
        if self.load_entrypoints:
            self._load_entrypoints()
        for module in self.modules:
            self._load_one(module, functools.partial(importlib.import_module, module), None)
        self._refresh()
        self._check_pending()

    def register(self, plugin: object, name: str | None = None) -> None:
        """Register a plugin object or module (built-ins, tests).

        Unlike :meth:`load`, a plugin that does not match the specs raises
        (``pluggy.PluginValidationError``), as does registering the same object twice (ValueError):
        for code shipped with meshd that is a bug. A blocked name is skipped with a log line.
        """
        try:
            registered = self.pm.register(plugin, name)
        except Exception:
            self._unregister_quietly(plugin)
            raise
        finally:
            self._refresh()
        if registered is None:
            log.info("plugin %s is blocked by %s; not registered", name or _describe(plugin), BLOCKED_ENV)

    def _load_entrypoints(self) -> None:
        try:
            entry_points = list(importlib.metadata.entry_points(group=ENTRYPOINT_GROUP))
        except Exception as exc:
            self._count("load_failed:<entry points>")
            log.error("cannot list the %r entry points, no installed plugin loaded: %s",
                      ENTRYPOINT_GROUP, exc)
            return
        for ep in entry_points:
            try:
                dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else None
            except Exception:
                dist = None
            self._load_one(ep.name, ep.load, dist)

    def _load_one(self, name: str, loader: Callable[[], object], dist: str | None) -> None:
        """Import and register one plugin; any failure is logged with its name and counted."""
        if self.pm.is_blocked(name):
            log.info("plugin %s is blocked by %s; not loaded", name, BLOCKED_ENV)
            return
        if self.pm.get_plugin(name) is not None:
            log.debug("plugin %s already registered; skipping the second one", name)
            return
        plugin: object = None
        try:
            plugin = loader()
            if self.pm.is_registered(plugin):
                log.info("plugin %s is already registered as %s; skipping", name, self.pm.get_name(plugin))
                return
            self.pm.register(plugin, name=name)
        except BaseException as exc:  # SystemExit from a plugin's import must not stop the daemon
            if isinstance(exc, KeyboardInterrupt):
                raise
            if plugin is not None:
                self._unregister_quietly(plugin)
            self.load_errors[name] = f"{type(exc).__name__}: {exc}"
            self._count(f"load_failed:{name}")
            log.error("plugin %s failed to load: %s", name, self.load_errors[name], exc_info=exc)
            return
        if dist is not None:
            self._dists[name] = dist
        log.info("plugin %s loaded (%s)", name, dist or _describe(plugin))

    def _unregister_quietly(self, plugin: object) -> None:
        # pluggy registers a plugin's hooks one by one: a validation error half way leaves the
        # first ones in place.
        try:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
        except Exception:
            log.debug("could not unregister a half-registered plugin", exc_info=True)

    def _check_pending(self) -> None:
        """Log hook implementations that match no spec (a typo, or a hook of a newer meshd)."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError:
            for hook_name, caller in vars(self.pm.hook).items():
                if hook_name.startswith("_") or caller.has_spec():
                    continue
                for impl in caller.get_hookimpls():
                    if not impl.optionalhook:
                        log.warning("plugin %s implements unknown hook %s; it will never be called",
                                    impl.plugin_name, hook_name)
        except Exception:
            log.warning("checking plugins for unknown hooks failed", exc_info=True)

    def _refresh(self) -> None:
        """Remember which observer hooks have implementations, so the others cost nothing."""
        self._wanted = frozenset(
            hook for hook in OBSERVER_HOOKS if getattr(self.pm.hook, hook).get_hookimpls()
        )

    def wants(self, hook: str) -> bool:
        """Whether any plugin implements observer ``hook`` (so the core can skip building events)."""
        return hook in self._wanted

    def list_plugins(self) -> list[dict[str, Any]]:
        """One dict per plugin: name, status ("loaded", "blocked" or "failed"), module, dist, hooks
        (sorted hook names it implements) and error (why it failed to load, else None)."""
        out: list[dict[str, Any]] = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                out.append({"name": name, "status": "blocked", "module": None, "dist": None, "hooks": [],
                            "error": None})
                continue
            callers = self.pm.get_hookcallers(plugin) or []
            out.append({"name": name, "status": "loaded", "module": _describe(plugin),
                        "dist": self._dists.get(name), "hooks": sorted(c.name for c in callers),
                        "error": None})
        for name, error in self.load_errors.items():
            out.append({"name": name, "status": "failed", "module": None, "dist": None, "hooks": [],
                        "error": error})
        return out

    # -- lifecycle hooks (node's loop) ----------------------------------------------------------

    async def startup(self, node: Any) -> None:
        """Call ``meshd_startup(node)`` on each plugin in turn, in pluggy's order (last registered
        first, tryfirst/trylast honoured); isolated, awaitables awaited with the hook timeout."""
        for impl in reversed(self.pm.hook.meshd_startup.get_hookimpls()):
            await self._call_in_loop(impl, "meshd_startup", {"node": node})

    async def shutdown(self, node: Any) -> None:
        """Call ``meshd_shutdown(node)`` on each plugin in turn, in the reverse of the start-up order."""
        for impl in self.pm.hook.meshd_shutdown.get_hookimpls():
            await self._call_in_loop(impl, "meshd_shutdown", {"node": node})

    async def _call_in_loop(self, impl: pluggy.HookImpl, hook: str, kwargs: dict[str, Any]) -> None:
        if impl.wrapper or impl.hookwrapper:
            return
        self._count("called")
        try:
            result = impl.function(*[kwargs[arg] for arg in impl.argnames])
            if inspect.isawaitable(result):
                await asyncio.wait_for(result, self.hook_timeout)
        except TimeoutError:
            self._timed_out(impl, hook)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the node itself is being cancelled
            self._failed(impl, hook)
        except Exception:
            self._failed(impl, hook)

    # -- observers and sinks (any thread; never block, never raise) ------------------------------

    def dead_letter(self, letter: Mapping[str, Any]) -> None:
        """Queue ``meshd_dead_letter(letter)`` for the worker thread."""
        if "meshd_dead_letter" in self._wanted:
            self._enqueue("meshd_dead_letter", {"letter": letter})

    def collaboration(self, outcome: Mapping[str, Any]) -> None:
        """Queue ``meshd_collaboration(outcome)`` for the worker thread."""
        if "meshd_collaboration" in self._wanted:
            self._enqueue("meshd_collaboration", {"outcome": outcome})

    def peer_state(self, peer: Mapping[str, Any], old: str, new: str) -> None:
        """Queue ``meshd_peer_state(peer, old, new)`` for the worker thread."""
        if "meshd_peer_state" in self._wanted:
            self._enqueue("meshd_peer_state", {"peer": peer, "old": old, "new": new})

    def agent_state(self, agent: Mapping[str, Any], old: str, new: str) -> None:
        """Queue ``meshd_agent_state(agent, old, new)`` for the worker thread."""
        if "meshd_agent_state" in self._wanted:
            self._enqueue("meshd_agent_state", {"agent": agent, "old": old, "new": new})

    @property
    def queued(self) -> int:
        """Events waiting for the worker thread (approximate)."""
        return self._queue.qsize()

    def _enqueue(self, hook: str, kwargs: dict[str, Any]) -> None:
        try:
            if self._closing.is_set():
                self._count("dropped")
                return
            self._queue.put_nowait((hook, _plain(kwargs)))
        except queue.Full:
            dropped = self._count("dropped")
            if dropped % _DROP_LOG_EVERY == 1:
                log.warning("plugin queue full (%d events): %d observer events dropped so far",
                            self._queue.maxsize, dropped)
        except Exception:
            self._count("dropped")
            log.debug("could not queue %s", hook, exc_info=True)

    # -- worker thread --------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread that calls observers and sinks (once)."""
        if self._thread is not None:
            raise RuntimeError("PluginHost.start() called twice")
        self._thread = threading.Thread(target=self._run, name="meshd-plugins", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, within ``timeout`` seconds, then end the worker thread.

        Events queued after this are dropped. If a plugin is still busy at the deadline the thread
        is left to finish that one call (it is a daemon thread) and the rest is abandoned
        (counted as ``abandoned``).
        """
        self._closing.set()
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._count("abandoned", self._discard_queued())
            return
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            self._queue.put(None, timeout=max(0.0, timeout))
        except queue.Full:
            pass
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            self._abandon.set()
            try:
                self._queue.put_nowait(None)  # wake the worker if it drained everything meanwhile
            except queue.Full:
                pass
            log.warning("plugin worker still busy after %.1f s; abandoning %d queued events",
                        timeout, self._queue.qsize())

    def _discard_queued(self) -> int:
        discarded = 0
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return discarded
            if item is not None:
                discarded += 1

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            while not self._abandon.is_set():
                item = self._queue.get()
                if item is None:
                    break
                hook, kwargs = item
                try:
                    self._dispatch(loop, hook, kwargs)
                except BaseException:  # a bug here must not end observer delivery
                    log.exception("plugin worker failed dispatching %s", hook)
        finally:
            self._count("abandoned", self._discard_queued())
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

    def _dispatch(self, loop: asyncio.AbstractEventLoop, hook: str, kwargs: dict[str, Any]) -> None:
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                continue
            if self._abandon.is_set():
                return
            self._count("called")
            try:
                # each plugin gets its own copy: one plugin's edits are not the next one's input
                result = impl.function(*[_plain(kwargs[arg]) for arg in impl.argnames])
                if inspect.isawaitable(result):
                    loop.run_until_complete(asyncio.wait_for(result, self.hook_timeout))
            except TimeoutError:
                self._timed_out(impl, hook)
            except BaseException:  # includes SystemExit/CancelledError raised by a plugin
                self._failed(impl, hook)

    # -- accounting -----------------------------------------------------------------------------

    def _count(self, key: str, n: int = 1) -> int:
        if n == 0:
            return self.stats[key]
        with self._lock:
            self.stats[key] += n
            return self.stats[key]

    def _failed(self, impl: pluggy.HookImpl, hook: str) -> None:
        count = self._count(f"failed:{impl.plugin_name}")
        if count == 1 or count % _FAIL_LOG_EVERY == 0:
            log.exception("plugin %s raised in %s (%d failures so far)", impl.plugin_name, hook, count)

    def _timed_out(self, impl: pluggy.HookImpl, hook: str) -> None:
        count = self._count(f"timed_out:{impl.plugin_name}")
        if count == 1 or count % _FAIL_LOG_EVERY == 0:
            log.warning("plugin %s timed out in %s after %.1f s (%d timeouts so far)",
                        impl.plugin_name, hook, self.hook_timeout, count)

    # -- syscall tools (issue 9, "tools" block) -------------------------------------------------

    def contributed_tools(self) -> list[tuple[str, Any]]:
        """``(plugin name, tool)`` for every tool each plugin's ``meshd_tools()`` returns, in
        registration order. A plugin that raises or returns a non-list is logged, counted and
        skipped; checking the tools themselves (types, duplicate names) is the registry's job."""
        out: list[tuple[str, Any]] = []
        for impl in reversed(self.pm.hook.meshd_tools.get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                continue
            self._count("called")
            try:
                result = impl.function()
            except Exception:
                self._failed(impl, "meshd_tools")
                continue
            if result is None:
                continue
            if not isinstance(result, list | tuple):
                self._count(f"failed:{impl.plugin_name}")
                log.error("plugin %s: meshd_tools returned %r, not a list of tools; ignored",
                          impl.plugin_name, type(result).__name__)
                continue
            out.extend((impl.plugin_name, tool) for tool in result)
        return out

    async def approve_tool(self, call: Mapping[str, Any]) -> Any:
        """The first non-None ``meshd_approve_tool(call)`` answer (awaited with the hook timeout),
        or None. A plugin that raises or times out answers ``"deny: ..."``: fail closed."""
        for impl in reversed(self.pm.hook.meshd_approve_tool.get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                continue
            self._count("called")
            try:
                result = impl.function(*[_plain(call) for _ in impl.argnames])
                if inspect.isawaitable(result):
                    result = await asyncio.wait_for(result, self.hook_timeout)
            except TimeoutError:
                self._timed_out(impl, "meshd_approve_tool")
                return f"deny: approval plugin {impl.plugin_name} timed out"
            except Exception:
                self._failed(impl, "meshd_approve_tool")
                return f"deny: approval plugin {impl.plugin_name} failed"
            if result is not None:
                return result
        return None

    def wants_authorize(self) -> bool:
        """Whether any plugin implements ``meshd_authorize`` (if not, everything is allowed)."""
        return bool(self.pm.hook.meshd_authorize.get_hookimpls())

    def authorize(self, action: str, subject: str, target: str, topic: str | None) -> Any:
        """The first non-None ``meshd_authorize`` answer, or None. Synchronous (an awaitable answer
        is refused, since callers may be on the routing path); an exception refuses."""
        kwargs = {"action": action, "subject": subject, "target": target, "topic": topic}
        for impl in reversed(self.pm.hook.meshd_authorize.get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                continue
            self._count("called")
            try:
                result = impl.function(*[kwargs[arg] for arg in impl.argnames])
            except Exception:
                self._failed(impl, "meshd_authorize")
                return f"authorization plugin {impl.plugin_name} failed"
            if inspect.isawaitable(result):
                close = getattr(result, "close", None)
                if callable(close):
                    close()
                return (f"authorization plugin {impl.plugin_name} returned an awaitable; "
                        "it must answer at once")
            if result is not None:
                return result
        return None

    def tool_event(self, event: Mapping[str, Any]) -> None:
        """Queue ``meshd_tool_event(event)`` for the worker thread."""
        if self.pm.hook.meshd_tool_event.get_hookimpls():
            self._enqueue("meshd_tool_event", {"event": event})
