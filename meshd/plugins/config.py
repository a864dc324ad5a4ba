"""A plugin's own config section, ``[plugins.NAME]``: the host's options and the plugin's settings.

Owns: the keys the host reads from a section (:data:`HOST_KEYS`: ``isolation``, ``queue_size``),
and validating the rest against the pydantic model the plugin declares through
``meshd_plugin_config()``, with errors that name the plugin and the key
(:class:`meshd.errors.ConfigError` with key ``plugins.NAME.KEY``). Must not touch: loading plugins,
calling hooks, or the daemon's own settings (:mod:`meshd.config` reads the TOML file and hands the
raw sections over).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

from meshd.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

__all__ = ["HOST_KEYS", "ISOLATION_MODES", "PluginOptions", "split_section", "validate_settings"]

#: Isolation modes a plugin may run in.
ISOLATION_MODES: Final = ("thread", "process")
#: Keys of ``[plugins.NAME]`` the host reads itself; the plugin's model never sees them.
HOST_KEYS: Final = frozenset({"isolation", "queue_size"})

Isolation = Literal["thread", "process"]


@dataclass(frozen=True)
class PluginOptions:
    """How the host runs one plugin."""

    #: ``"thread"`` (default): a thread of its own; ``"process"``: a supervised child process.
    isolation: Isolation = "thread"
    #: This plugin's queue bound; None means the daemon's ``plugin_queue_size``.
    queue_size: int | None = None


def split_section(name: str, section: Mapping[str, Any]) -> tuple[PluginOptions, dict[str, Any]]:
    """The host's options and the plugin's own keys of section ``[plugins.<name>]``."""
    own = {key: value for key, value in section.items() if key not in HOST_KEYS}
    isolation = section.get("isolation", "thread")
    if isolation not in ISOLATION_MODES:
        raise ConfigError(f"plugins.{name}.isolation",
                          f"must be one of {', '.join(map(repr, ISOLATION_MODES))}, not {isolation!r}")
    queue_size = section.get("queue_size")
    if queue_size is not None and (type(queue_size) is not int or queue_size < 1):
        raise ConfigError(f"plugins.{name}.queue_size", f"must be an integer >= 1, not {queue_size!r}")
    return PluginOptions(isolation=isolation, queue_size=queue_size), own


def validate_settings(name: str, model: object, values: Mapping[str, Any]) -> BaseModel | None:
    """Plugin ``name``'s settings, validated by its ``model``; None when it declares no model.

    A plugin without a model and a section with keys of its own is an error (those keys would be
    silently ignored otherwise), as is any value the model refuses.
    """
    if model is None:
        if values:
            key = sorted(values)[0]
            raise ConfigError(f"plugins.{name}.{key}",
                              f"plugin {name!r} declares no settings (no meshd_plugin_config hook)")
        return None
    from pydantic import BaseModel, ValidationError  # only when a plugin declares settings

    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(f"plugins.{name}", f"plugin {name!r}: meshd_plugin_config returned "
                          f"{model!r}, not a pydantic model class")
    try:
        return model.model_validate(dict(values))
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = ".".join(str(part) for part in err.get("loc", ()))
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        where = f"plugins.{name}.{loc}" if loc else f"plugins.{name}"
        value = err.get("input")
        shown = "" if err.get("type") == "missing" else f" (got {value!r})"
        raise ConfigError(where, f"plugin {name!r}: {msg}{shown}") from None
