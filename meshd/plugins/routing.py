"""The content-routing hooks of the plugin host: which agent a ``route:`` address means.

Owns: :class:`RouteHooks`, the part of :class:`meshd.plugins.PluginHost` that calls
``meshd_route`` and ``meshd_route_payload``, each implementation on its own, synchronously (they
run on the routing path), isolated (a raising plugin, or one answering with an awaitable, counts
as no choice and is logged). Must not touch: loading, workers, the node, sockets.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pluggy

__all__ = ["RouteHooks"]

log = logging.getLogger("meshd.plugins")


class RouteHooks:
    """Mixed into :class:`meshd.plugins.PluginHost`, which provides what is declared here."""

    if TYPE_CHECKING:
        pm: pluggy.PluginManager

        def _count(self, key: str, n: int = 1) -> int: ...
        def _failed(self, impl: pluggy.HookImpl, hook: str) -> None: ...

    def wants_route(self) -> bool:
        """Whether any plugin implements ``meshd_route`` (if not, ``route:`` addresses exist nowhere)."""
        return bool(self.pm.hook.meshd_route.get_hookimpls())

    def _first(self, hook: str, kwargs: Mapping[str, Any]) -> Any:
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):
            if impl.wrapper or impl.hookwrapper:
                continue
            self._count("called")
            try:
                result = impl.function(*[kwargs[arg] for arg in impl.argnames])
            except Exception:
                self._failed(impl, hook)
                continue
            if inspect.isawaitable(result):
                close = getattr(result, "close", None)
                if callable(close):
                    close()
                log.warning("plugin %s answered %s with an awaitable; it must answer at once",
                            impl.plugin_name, hook)
                self._count(f"failed:{impl.plugin_name}")
                continue
            if result is not None:
                return result
        return None

    def route(self, route: str, message: Mapping[str, Any]) -> Any:
        """The first non-None ``meshd_route`` answer, or None."""
        return self._first("meshd_route", {"route": route, "message": message})

    def route_payload(self, route: str) -> bool:
        """Whether a plugin asks for the decoded payload of messages to ``route:<route>``."""
        return self._first("meshd_route_payload", {"route": route}) is True
