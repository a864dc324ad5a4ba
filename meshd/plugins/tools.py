"""The syscall-tool hooks of the plugin host: tools contributed, approvals, authorization, tool events.

Owns: :class:`ToolHooks`, the part of :class:`meshd.plugins.PluginHost` that calls
``meshd_tools``, ``meshd_approve_tool``, ``meshd_authorize`` and ``meshd_tool_event``, each
implementation on its own and isolated (a raising approval or authorization plugin refuses: fail
closed). Must not touch: loading, configuration, workers or the node; it uses the host's plugin
manager, counters and queues (declared below) and nothing else.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from meshd.plugins.workers import plain

if TYPE_CHECKING:
    import pluggy

__all__ = ["ToolHooks"]

log = logging.getLogger("meshd.plugins")


class ToolHooks:
    """Mixed into :class:`meshd.plugins.PluginHost`, which provides what is declared here."""

    if TYPE_CHECKING:
        pm: pluggy.PluginManager
        hook_timeout: float
        _routes: dict[str, tuple[Any, ...]]

        def _count(self, key: str, n: int = 1) -> int: ...
        def _failed(self, impl: pluggy.HookImpl, hook: str) -> None: ...
        def _timed_out(self, impl: pluggy.HookImpl, hook: str) -> None: ...
        def _offer(self, hook: str, kwargs: dict[str, Any]) -> None: ...

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
                result = impl.function(*[plain(call) for _ in impl.argnames])
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
        if "meshd_tool_event" in self._routes:
            self._offer("meshd_tool_event", {"event": event})
