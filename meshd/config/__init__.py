"""The daemon's settings: TOML file, ``MESHD_*`` environment and flags, validated by pydantic.

Holds :class:`Settings` and its sections (:mod:`meshd.config.settings`, :mod:`meshd.config.sections`).
The names below are re-exported lazily, so ``from meshd.config import Settings`` works as it always
did while importing a submodule does not load pydantic until a name is used.

May import: :mod:`meshd.util`, :mod:`meshd.wire`, :mod:`meshd.errors`. Nothing above it.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from meshd.config.settings import (
        ENV_PREFIX,
        SYSTEMD_SOCKET,
        Settings,
        SpawnSettings,
        SpawnTemplate,
        TaskSettings,
        ToolsSettings,
        default_runtime_dir,
        default_socket_path,
        default_state_dir,
        ensure_dirs,
        find_agent_socket,
        load_settings,
    )

__all__ = [
    "ENV_PREFIX",
    "SYSTEMD_SOCKET",
    "Settings",
    "SpawnSettings",
    "SpawnTemplate",
    "TaskSettings",
    "ToolsSettings",
    "default_runtime_dir",
    "default_socket_path",
    "default_state_dir",
    "ensure_dirs",
    "find_agent_socket",
    "load_settings",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from meshd.config import settings

        return getattr(settings, name)
    raise AttributeError(f"module 'meshd.config' has no attribute {name!r}")
