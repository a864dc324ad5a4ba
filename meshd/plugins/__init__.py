"""The plugin host: pluggy, entry points, per-plugin workers and process isolation.

Holds :class:`PluginHost` (:mod:`meshd.plugins.host`, the typed facade the daemon calls), each
plugin's worker thread and bounded queue (``workers``), the child process of a plugin with
``isolation = "process"`` (``process``), plugin config sections (``config``), entry-point loading
(``entrypoints``), the tools plugins contribute (``tools``), the authorization and approval
policy (``policy``) and the plugins that ship with meshd (``builtin``).

May import: :mod:`meshd.hookspecs`, :mod:`meshd.view`, :mod:`meshd.wire`, :mod:`meshd.util`,
:mod:`meshd.errors`, :mod:`meshd.config`. Never ``client``, ``daemon`` or ``cli``. ``PluginHost``
and its constants are re-exported lazily (``from meshd.plugins import PluginHost``).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshd.plugins.host import AUTOLOAD_ENV, BLOCKED_ENV, ENTRYPOINT_GROUP, OBSERVER_HOOKS, PluginHost

__all__ = ["AUTOLOAD_ENV", "BLOCKED_ENV", "ENTRYPOINT_GROUP", "OBSERVER_HOOKS", "PluginHost"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from meshd.plugins import host

        return getattr(host, name)
    raise AttributeError(f"module 'meshd.plugins' has no attribute {name!r}")
