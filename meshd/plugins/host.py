"""The plugin host: loads meshd plugins, configures them, and calls their hooks without letting
them hurt routing.

:class:`PluginHost` is a typed facade over a pluggy ``PluginManager`` (project ``meshd``, specs in
:mod:`meshd.hookspecs`), with one method per hook, so the core never calls ``pm.hook.*`` itself.
It owns loading, configuration and the lifecycle calls; the per-plugin queues live in
:mod:`meshd.plugins.workers` (thread mode) and :mod:`meshd.plugins.process` (process mode), the
``[plugins.NAME]`` section rules in :mod:`meshd.plugins.config`, the syscall-tool hooks in
:mod:`meshd.plugins.tools`. It must not touch the node's
internals: plugins get the node only as the :class:`meshd.view.NodeView` the node passes in.

Loading (:meth:`PluginHost.load`): every entry point of the ``meshd`` group, then each module named
in the config. Each plugin loads on its own: one that fails to import or register is logged with
its name and counted (``load_failed:<name>``), and the others still load (pluggy's own entry-point
loader stops at the first failure). Names listed in ``MESHD_BLOCKED_PLUGINS`` (comma-separated) are
blocked before anything is imported. Then each plugin's section is validated against the model its
``meshd_plugin_config()`` returns (a bad section raises :class:`meshd.errors.ConfigError` naming
``plugins.NAME.KEY``) and handed to its ``meshd_configure(config)``.

Calling: pluggy stops a hook call at the first exception, so the host calls each implementation on
its own and isolates it.

* Observers and sinks (dead letters, collaboration outcomes, peer and agent state): the routing
  loop copies the event once and offers it to the queue of every plugin that implements the hook
  (``put_nowait``), and returns. Each plugin has its own bounded queue and its own worker (a thread,
  or a child process with ``isolation = "process"``); a full queue drops the event for that plugin
  only and counts ``dropped`` and ``dropped:<plugin>``. The caller never blocks or sees an exception.
* Lifecycle: ``meshd_startup`` runs before the workers start, ``meshd_shutdown`` after they
  drained, so it is the last call a plugin gets. In thread mode both are awaited in the node's
  loop, one plugin at a time; in process mode they run in the child.

An awaitable returned by a plugin is awaited with ``hook_timeout``; timeouts count
``timed_out:<plugin>``, exceptions ``failed:<plugin>``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import importlib
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import pluggy

from meshd import hookspecs
from meshd.errors import ConfigError
from meshd.plugins.config import PluginOptions, split_section, validate_settings
from meshd.plugins.entrypoints import handed_over, list_entry_points, load_value
from meshd.plugins.process import NodeSnapshot, ProcessWorker
from meshd.plugins.routing import RouteHooks
from meshd.plugins.tools import ToolHooks
from meshd.plugins.workers import ThreadWorker, call_impl, close_loop, plain

if TYPE_CHECKING:  # imported by plugin_config only when a plugin declares settings
    from pydantic import BaseModel

__all__ = ["AUTOLOAD_ENV", "BLOCKED_ENV", "ENTRYPOINT_GROUP", "OBSERVER_HOOKS", "PluginHost"]

log = logging.getLogger("meshd.plugins")

#: Environment variable naming plugins not to load (comma-separated entry-point or module names).
BLOCKED_ENV: Final = "MESHD_BLOCKED_PLUGINS"
#: Environment variable that, set to anything but "" or "0", loads no entry-point plugin at all
#: (as pytest's PYTEST_DISABLE_PLUGIN_AUTOLOAD): plugins named in the config still load. meshd's own
#: test suite sets it, so a plugin installed beside meshd cannot change what the daemon tests see.
AUTOLOAD_ENV: Final = "MESHD_DISABLE_PLUGIN_AUTOLOAD"
#: The entry-point group third-party distributions register their plugin under.
ENTRYPOINT_GROUP: Final = hookspecs.PROJECT
#: Hooks called by each plugin's worker, through its queue.
OBSERVER_HOOKS: Final = ("meshd_dead_letter", "meshd_collaboration", "meshd_peer_state", "meshd_agent_state",
                         "meshd_task_event", "meshd_tool_event")
#: Hooks the host calls itself, never through a queue.
LIFECYCLE_HOOKS: Final = ("meshd_plugin_config", "meshd_configure", "meshd_startup", "meshd_shutdown")

_Worker = ThreadWorker | ProcessWorker


def _describe(plugin: object) -> str:
    """The import path of a plugin: its module name, or ``module.Class`` for an instance."""
    if inspect.ismodule(plugin):
        return plugin.__name__
    cls = type(plugin)
    return f"{cls.__module__}.{cls.__qualname__}"


class PluginHost(ToolHooks, RouteHooks):
    """Loads plugins and calls their hooks, one typed method per hook.

    Lifecycle, as the node drives it: ``load()`` (and ``register()`` for built-ins; both
    configure each plugin from its section), ``await startup(node)``, ``start()`` the workers; at
    the end ``await shutdown(node)`` (drains the queues, then calls ``meshd_shutdown``) and
    ``stop()``. The four observer methods may be called at any time from the routing loop; events
    offered before ``start()`` wait in the plugins' queues, events after ``shutdown()`` or
    ``stop()`` are dropped and counted.

    ``sections`` maps plugin names to their ``[plugins.NAME]`` config section (raw values);
    ``queue_size`` is the bound of each plugin's queue unless its section sets ``queue_size``.
    """

    def __init__(
        self,
        modules: Sequence[str] = (),
        *,
        load_entrypoints: bool = True,
        queue_size: int = 10_000,
        hook_timeout: float = 5.0,
        environ: Mapping[str, str] | None = None,
        sections: Mapping[str, Mapping[str, Any]] | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, not {queue_size}")
        if not hook_timeout > 0:
            raise ValueError(f"hook_timeout must be positive, not {hook_timeout}")
        self.modules: tuple[str, ...] = tuple(modules)
        self.load_entrypoints = load_entrypoints
        self.hook_timeout = hook_timeout
        self.queue_size = queue_size
        self.sections: dict[str, dict[str, Any]] = {k: dict(v) for k, v in (sections or {}).items()}
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.stats: collections.Counter[str] = collections.Counter()
        #: name -> "ExcType: message" for each plugin that failed to load.
        self.load_errors: dict[str, str] = {}
        self._dists: dict[str, str] = {}
        #: name -> what process mode imports in the child (``module`` or ``module:attr``).
        self._specs: dict[str, str] = {}
        #: name -> how the host runs it, and its validated settings (None: it declares none).
        self.options: dict[str, PluginOptions] = {}
        self.configs: dict[str, BaseModel | None] = {}
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        #: observer hook -> the workers of the plugins implementing it.
        self._routes: dict[str, tuple[_Worker, ...]] = {}
        self._started = False
        self._closed = False
        self._node: NodeSnapshot | None = None
        #: Called after :meth:`register` or :meth:`unregister` changed the hooks at run time (the
        #: node turns its outcome tracking on or off with it).
        #: Called after :meth:`register` or :meth:`unregister` changed the hooks at run time (the
        #: node turns its outcome tracking on or off with it).
        self.on_change = on_change
        env = os.environ if environ is None else environ
        if env.get(AUTOLOAD_ENV, "") not in ("", "0"):
            self.load_entrypoints = False
        self.blocked: tuple[str, ...] = tuple(
            name.strip() for name in env.get(BLOCKED_ENV, "").split(",") if name.strip()
        )
        for name in self.blocked:
            self.pm.set_blocked(name)

    # -- loading --------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the ``meshd`` entry points (if enabled), then each configured module, then configure
        each plugin from its section.

        A plugin that fails to load is counted and skipped; a section that its plugin's model
        refuses raises :class:`ConfigError` (key ``plugins.NAME.KEY``): start-up must stop there.
        A section naming no loaded plugin is logged and ignored.
        """
        if self.load_entrypoints:
            self._load_entrypoints()
        for module in self.modules:
            self._specs.setdefault(module, module)
            self._load_one(module, functools.partial(importlib.import_module, module), None)
        for name, plugin in self.pm.list_name_plugin():
            if plugin is not None and name not in self.options:
                self._configure(name, plugin)
        for name in sorted(set(self.sections) - set(self.options)):
            log.warning("config section [plugins.%s] names no loaded plugin; ignored%s", name,
                        f" (it failed to load: {self.load_errors[name]})" if name in self.load_errors else "")
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
            registered_as = self.pm.get_name(plugin) if registered is not None else None
            if registered_as is not None:
                if inspect.ismodule(plugin):
                    self._specs.setdefault(registered_as, plugin.__name__)
                self._configure(registered_as, plugin)
        except Exception:
            self._unregister_quietly(plugin)
            raise
        finally:
            self._refresh()
            self._changed()
        if registered is None:
            log.info("plugin %s is blocked by %s; not registered", name or _describe(plugin), BLOCKED_ENV)

    def unregister(self, name: str) -> bool:
        """Unregister plugin ``name`` (registered with :meth:`register`, e.g. the gateway's
        dashboard observer): its hooks are no longer called, its worker takes no more events and
        ends in the background (what it holds is delivered within the hook timeout), the hook
        routes are rebuilt and :attr:`on_change` is told. Returns whether it was registered."""
        plugin = self.pm.get_plugin(name)
        if plugin is None:
            return False
        self.pm.unregister(plugin, name)
        worker = self._workers.pop(name, None)
        self._refresh()
        self._changed()
        if worker is not None:
            worker.close()
            deadline = time.monotonic() + self.hook_timeout
            threading.Thread(target=worker.stop, args=(deadline,), name=f"meshd-plugin-stop-{name}",
                             daemon=True).start()
        return True

    def _changed(self) -> None:
        if self.on_change is not None:
            try:
                self.on_change()
            except Exception:
                log.exception("plugin change listener failed")

    def _load_entrypoints(self) -> None:
        try:
            entry_points = handed_over()  # meshd run lists them before it re-execs (meshd/daemon/reexec.py)
            entry_points = list_entry_points(ENTRYPOINT_GROUP) if entry_points is None else entry_points
        except Exception as exc:
            self._count("load_failed:<entry points>")
            log.error("cannot list the %r entry points, no installed plugin loaded: %s",
                      ENTRYPOINT_GROUP, exc)
            return
        for name, value, dist in entry_points:
            self._specs.setdefault(name, value)
            self._load_one(name, functools.partial(load_value, value), dist)

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

    def _configure(self, name: str, plugin: object) -> None:
        """Validate plugin ``name``'s section and, in thread mode, hand it to ``meshd_configure``.

        Raises :class:`ConfigError` for a bad section. A ``meshd_plugin_config`` that raises makes
        the plugin a load failure (unregistered, counted), like an import error.
        """
        options, own = split_section(name, self.sections.get(name, {}))
        if options.isolation == "process" and name not in self._specs:
            raise ConfigError(f"plugins.{name}.isolation",
                              f"plugin {name!r} was registered as an object; only plugins loaded by "
                              "name (entry point or module) can run in a process")
        try:
            config = self.validate_section(name, own)
        except ConfigError:
            raise
        except Exception as exc:
            self._unregister_quietly(plugin)
            self.load_errors[name] = f"meshd_plugin_config: {type(exc).__name__}: {exc}"
            self._count(f"load_failed:{name}")
            log.error("plugin %s failed to declare its settings: %s", name, exc, exc_info=exc)
            return
        self.options[name] = options
        self.configs[name] = config
        if config is not None and options.isolation == "thread":
            loop = asyncio.new_event_loop()
            try:
                for impl in self._impls(name, "meshd_configure"):
                    call_impl(loop, name, impl, "meshd_configure", {"config": config},
                              self.hook_timeout, self._count)
            finally:
                close_loop(loop)

    def validate_section(self, name: str, own: Mapping[str, Any]) -> BaseModel | None:
        """Plugin ``name``'s own keys validated by the model its ``meshd_plugin_config`` returns."""
        model: object = None
        for impl in self._impls(name, "meshd_plugin_config"):
            model = impl.function()
            if model is not None:
                break
        return validate_settings(name, model, own)

    def _impls(self, name: str, hook: str) -> list[pluggy.HookImpl]:
        """Plugin ``name``'s callable implementations of ``hook``, in pluggy's call order."""
        return [impl for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls())
                if impl.plugin_name == name and not (impl.wrapper or impl.hookwrapper)]

    def _refresh(self) -> None:
        """Give each plugin with observer hooks its worker, and route each hook to its workers."""
        routes: dict[str, list[_Worker]] = {}
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            impls = {hook: self._impls(name, hook) for hook in OBSERVER_HOOKS}
            impls = {hook: found for hook, found in impls.items() if found}
            worker = self._workers.get(name)
            if worker is None and (impls or self.options.get(name, PluginOptions()).isolation == "process"):
                worker = self._workers[name] = self._make_worker(name, impls)
                if self._started:
                    worker.start()
            for hook in impls:
                routes.setdefault(hook, []).append(worker)  # type: ignore[arg-type]
        self._routes = {hook: tuple(workers) for hook, workers in routes.items()}

    def _make_worker(self, name: str, impls: dict[str, list[pluggy.HookImpl]]) -> _Worker:
        options = self.options.get(name, PluginOptions())
        size = options.queue_size or self.queue_size
        if options.isolation == "process":
            _, own = split_section(name, self.sections.get(name, {}))
            return ProcessWorker(name, self._specs[name], frozenset(impls), section=own, queue_size=size,
                                 hook_timeout=self.hook_timeout, count=self._count)
        return ThreadWorker(name, impls, queue_size=size, hook_timeout=self.hook_timeout,
                            count=self._count)

    def wants(self, hook: str) -> bool:
        """Whether any plugin implements observer ``hook`` (so the core can skip building events)."""
        return hook in self._routes

    def hook_times(self) -> dict[str, dict[str, dict[str, float]]]:
        """Time spent in each thread-mode plugin's observer hooks: ``{plugin: {hook: {calls,
        seconds, cpu_seconds}}}`` (a process-mode plugin's time is its own process's)."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for name, worker in self._workers.items():
            times = getattr(worker, "hook_times", None)
            if times is not None:
                out[name] = times()
        return out

    def queue_depths(self) -> dict[str, int]:
        """Events waiting per plugin (approximate)."""
        return {name: worker.queued for name, worker in self._workers.items()}

    def list_plugins(self) -> list[dict[str, Any]]:
        """One dict per plugin: name, status ("loaded", "blocked" or "failed"), module, dist, hooks
        (sorted hook names it implements), error (why it failed to load, else None), and for a
        loaded plugin its isolation (``"thread"`` or ``"process"``) and queue_size."""
        out: list[dict[str, Any]] = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                out.append({"name": name, "status": "blocked", "module": None, "dist": None, "hooks": [],
                            "error": None})
                continue
            callers = self.pm.get_hookcallers(plugin) or []
            options = self.options.get(name, PluginOptions())
            out.append({"name": name, "status": "loaded", "module": _describe(plugin),
                        "dist": self._dists.get(name), "hooks": sorted(c.name for c in callers),
                        "error": None, "isolation": options.isolation,
                        "queue_size": options.queue_size or self.queue_size})
        for name, error in self.load_errors.items():
            out.append({"name": name, "status": "failed", "module": None, "dist": None, "hooks": [],
                        "error": error})
        return out

    # -- lifecycle hooks (node's loop) ----------------------------------------------------------

    async def startup(self, node: Any) -> None:
        """Call ``meshd_startup(node)`` on each thread-mode plugin in turn, in pluggy's order (last
        registered first, tryfirst/trylast honoured); isolated, awaitables awaited with the hook
        timeout. Process-mode plugins get a :class:`NodeSnapshot` of ``node`` in their child,
        which :meth:`start` launches."""
        if any(isinstance(w, ProcessWorker) for w in self._workers.values()):
            self._node = _snapshot(node)
            for worker in self._workers.values():
                if isinstance(worker, ProcessWorker):
                    worker.node = self._node
        for impl in reversed(self.pm.hook.meshd_startup.get_hookimpls()):
            if self._in_thread_mode(impl) or self._routes_here(impl):
                await self._call_in_loop(impl, "meshd_startup", {"node": node})

    def _routes_here(self, impl: pluggy.HookImpl) -> bool:
        """A plugin implementing ``meshd_route`` answers it in the daemon, on the routing path,
        whatever its isolation (meshd/plugins/routing.py): it gets the node there too."""
        return any(r.plugin_name == impl.plugin_name for r in self.pm.hook.meshd_route.get_hookimpls())

    async def shutdown(self, node: Any) -> None:
        """Stop taking events, let every plugin's worker deliver what it holds (bounded by the hook
        timeout), then call ``meshd_shutdown(node)`` on each plugin in the reverse of the start-up
        order: it is the last call a plugin gets. Process-mode children run their own
        ``meshd_shutdown`` after their queue, then exit."""
        await asyncio.to_thread(self._stop_workers, self.hook_timeout, self._node)
        for impl in self.pm.hook.meshd_shutdown.get_hookimpls():
            if self._in_thread_mode(impl) or self._routes_here(impl):
                await self._call_in_loop(impl, "meshd_shutdown", {"node": node})

    def _in_thread_mode(self, impl: pluggy.HookImpl) -> bool:
        return self.options.get(impl.plugin_name, PluginOptions()).isolation == "thread"

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
        """Queue ``meshd_dead_letter(letter)`` for each plugin implementing it."""
        if "meshd_dead_letter" in self._routes:
            self._offer("meshd_dead_letter", {"letter": letter})

    def collaboration(self, outcome: Mapping[str, Any]) -> None:
        """Queue ``meshd_collaboration(outcome)`` for each plugin implementing it."""
        if "meshd_collaboration" in self._routes:
            self._offer("meshd_collaboration", {"outcome": outcome})

    def peer_state(self, peer: Mapping[str, Any], old: str, new: str) -> None:
        """Queue ``meshd_peer_state(peer, old, new)`` for each plugin implementing it."""
        if "meshd_peer_state" in self._routes:
            self._offer("meshd_peer_state", {"peer": peer, "old": old, "new": new})

    def agent_state(self, agent: Mapping[str, Any], old: str, new: str) -> None:
        """Queue ``meshd_agent_state(agent, old, new)`` for each plugin implementing it."""
        if "meshd_agent_state" in self._routes:
            self._offer("meshd_agent_state", {"agent": agent, "old": old, "new": new})

    # -- tasks and spawning ------------------------------------------------------------------------

    def task_event(self, event: str, data: Mapping[str, Any]) -> None:
        """Queue ``meshd_task_event(event, data)`` for the worker thread."""
        if "meshd_task_event" in self._routes:
            self._offer("meshd_task_event", {"event": event, "data": data})

    def spawner(self, *, settings: Any, socket_path: Any, emit: Any) -> Any:
        """The first non-None ``meshd_spawner`` result, or None (use the built-in spawner).

        Unlike observers this is a decision: a plugin that raises stops the caller with a
        RuntimeError naming it, rather than silently falling back to plain processes.
        """
        for impl in reversed(self.pm.hook.meshd_spawner.get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                continue
            kwargs = {"settings": settings, "socket_path": socket_path, "emit": emit}
            try:
                result = impl.function(*[kwargs[arg] for arg in impl.argnames])
            except Exception as exc:
                self._count(f"failed:{impl.plugin_name}")
                raise RuntimeError(f"plugin {impl.plugin_name} failed in meshd_spawner: {exc}") from exc
            if result is not None:
                log.info("plugin %s provides the spawner", impl.plugin_name)
                return result
        return None

    @property
    def queued(self) -> int:
        """Events waiting in all plugins' queues (approximate)."""
        return sum(worker.queued for worker in self._workers.values())

    def _offer(self, hook: str, kwargs: dict[str, Any]) -> None:
        try:
            # One copy, taken now, that no one edits: each worker copies it again per call.
            event = plain(kwargs)
        except Exception:
            self._count("dropped")
            log.debug("could not copy %s", hook, exc_info=True)
            return
        for worker in self._routes.get(hook, ()):
            try:
                worker.offer(hook, event)
            except Exception:
                self._count("dropped")
                log.debug("could not queue %s for %s", hook, worker.name, exc_info=True)

    # -- workers --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every plugin's worker (thread or child process), once."""
        if self._started:
            raise RuntimeError("PluginHost.start() called twice")
        self._started = True
        for worker in self._workers.values():
            worker.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, within ``timeout`` seconds in all, then end every worker.

        Events offered after this are dropped. A thread still busy at the deadline is left to
        finish its call (a daemon thread) and what is queued is abandoned (counted as
        ``abandoned``); a child process still busy is terminated.
        """
        self._stop_workers(timeout, None)

    def _stop_workers(self, timeout: float, node: NodeSnapshot | None) -> None:
        if self._closed:
            return
        self._closed = True
        for worker in self._workers.values():
            worker.close()
        deadline = time.monotonic() + max(0.0, timeout)
        for worker in self._workers.values():
            if isinstance(worker, ProcessWorker):
                worker.stop(deadline, node)
            else:
                worker.stop(deadline)

    # -- accounting -----------------------------------------------------------------------------

    def count(self, key: str, n: int = 1) -> int:
        """Add ``n`` to counter ``key`` (thread-safe) and return its total."""
        return self._count(key, n)

    def _count(self, key: str, n: int = 1) -> int:
        if n == 0:
            return self.stats[key]
        with self._lock:
            self.stats[key] += n
            return self.stats[key]

    def _failed(self, impl: pluggy.HookImpl, hook: str) -> None:
        count = self._count(f"failed:{impl.plugin_name}")
        if count == 1 or count % 1000 == 0:
            log.exception("plugin %s raised in %s (%d failures so far)", impl.plugin_name, hook, count)

    def _timed_out(self, impl: pluggy.HookImpl, hook: str) -> None:
        count = self._count(f"timed_out:{impl.plugin_name}")
        if count == 1 or count % 1000 == 0:
            log.warning("plugin %s timed out in %s after %.1f s (%d timeouts so far)",
                        impl.plugin_name, hook, self.hook_timeout, count)


def _snapshot(node: Any) -> NodeSnapshot:
    """A picklable copy of what a :class:`meshd.view.NodeView` shows now (for process mode)."""
    def read(method: str, default: Any) -> Any:
        try:
            return plain(getattr(node, method)())
        except Exception:
            return default
    metrics = None
    try:
        metrics = node.metrics_snapshot()
    except Exception:
        pass
    return NodeSnapshot(node_id=str(getattr(node, "node_id", "")), name=str(getattr(node, "name", "")),
                        mesh=str(getattr(node, "mesh", "")), info_at_start=read("info", {}),
                        agents_at_start=read("agents", []), peers_at_start=read("peers", []),
                        dead_letters_at_start=read("dead_letters", []), metrics_at_start=metrics)
