"""``meshd run`` validates its config, then runs in a fresh interpreter that never imports pydantic.

pydantic (and pydantic-core) cost an idle daemon about 10 MiB of resident memory, and a Python
process cannot unload a library it imported. So ``meshd run`` validates exactly as before (the
same errors, exit 2), then replaces itself (``execv``: the same PID, so systemd's Type=notify and
``NotifyAccess=main`` are unaffected) with ``python -m meshd <the same arguments> --settings-fd N``,
where fd N is an anonymous memory file (memfd) holding the validated settings as a
:class:`SettingsSnapshot` and the run options parsed from the command line. The new image
(meshd/__main__.py sends it to meshd/daemon/run.py, without argparse) reads it, closes it and
runs the daemon.

Owns: the snapshot (the validated :class:`meshd.config.Settings` as plain attributes: the same
names, types and values; nested sections as :class:`SettingsSection`; ``resolved_socket()``,
``resolved_authorized_keys()`` and ``plugin_sections`` as on Settings; anything else, such as
``model_dump()``, is answered by a real Settings built from the snapshot on first use, which
imports pydantic then) with the ``meshd`` entry points listed (meshd/plugins/entrypoints.py),
passing both across ``execv``, and when not to re-exec: when the caller
passed ``argv`` (tests and embedders calling ``meshd_main`` in-process), where ``memfd_create``
is missing, or with ``MESHD_REEXEC=0``.
Must not import pydantic or meshd.config at import time, nor touch anything but the settings.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from meshd.plugins.entrypoints import Listed, hand_over
from meshd.util.paths import default_socket_path

if TYPE_CHECKING:
    from meshd.config.settings import Settings

__all__ = ["SettingsSection", "SettingsSnapshot", "exec_with_settings", "read_image", "read_settings",
           "settings_for_run", "wanted"]

FD_FLAG = "--settings-fd"
ENV_SWITCH = "MESHD_REEXEC"  # "0": run in the validating interpreter (pydantic stays loaded)
_MAX_BYTES = 16 * 1024 * 1024  # a snapshot larger than this is not a config file's


class SettingsSection(types.SimpleNamespace):
    """One nested settings model (``tasks``, ``spawn``, a spawn template, ``tools``) as attributes."""


class SettingsSnapshot(types.SimpleNamespace):
    """Validated daemon settings without pydantic: read them as you would :class:`Settings`."""

    plugin_sections: dict[str, dict[str, Any]]

    def resolved_authorized_keys(self) -> Path:
        """The authorized-keys folder: the setting, or <state_dir>/authorized_keys."""
        keys: Path | None = self.authorized_keys_dir
        state: Path = self.state_dir
        return keys or state / "authorized_keys"

    def resolved_socket(self) -> Path:
        """The agent socket path: ``socket`` if set, else the default socket path."""
        sock: Path | None = self.socket
        return sock if sock is not None else default_socket_path()

    def as_settings(self) -> Settings:
        """A real :class:`Settings` with these values (imports pydantic; built once)."""
        real = self.__dict__.get("_real")
        if real is None:
            from meshd.config.settings import Settings

            fields = {k: _to_plain(v) for k, v in vars(self).items() if k not in ("plugin_sections", "_real")}
            real = Settings.model_validate(fields)
            real._plugin_sections = self.plugin_sections
            self.__dict__["_real"] = real
        return real

    def __getattr__(self, name: str) -> Any:
        # Only for names the snapshot lacks (pydantic's model_* methods and the like).
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.as_settings(), name)


def _to_plain(value: Any) -> Any:
    if isinstance(value, SettingsSection):
        return {k: _to_plain(v) for k, v in vars(value).items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    return value


def _from_model(value: Any) -> Any:
    fields = getattr(type(value), "model_fields", None)
    if isinstance(fields, dict):  # a pydantic model (the nested sections)
        return SettingsSection(**{name: _from_model(getattr(value, name)) for name in fields})
    if isinstance(value, list | tuple):
        return type(value)(_from_model(v) for v in value)
    if isinstance(value, dict):
        return {k: _from_model(v) for k, v in value.items()}
    return value


def snapshot(settings: Settings) -> SettingsSnapshot:
    """The validated ``settings`` as a :class:`SettingsSnapshot`."""
    values = {name: _from_model(getattr(settings, name)) for name in type(settings).model_fields}
    return SettingsSnapshot(**values, plugin_sections=_from_model(settings.plugin_sections))


def wanted(argv: list[str] | None) -> bool:
    """Whether ``meshd run`` should re-exec: its real command line, memfd available, not switched off."""
    return argv is None and hasattr(os, "memfd_create") and os.environ.get(ENV_SWITCH, "1") != "0"


def exec_with_settings(settings: Settings, options: Mapping[str, Any] | None = None) -> NoReturn:
    """Replace this process with ``python -m meshd <same args> --settings-fd N``; raises OSError.
    ``options``: what the command line asked for besides settings (``regenerate_id``), handed over
    so that the new image parses no command line (meshd/daemon/run.py: no argparse)."""
    from meshd.plugins.entrypoints import list_entry_points
    from meshd.plugins.host import ENTRYPOINT_GROUP

    try:  # listed here, where importlib.metadata is loaded anyway; the daemon's image reuses the list
        entry_points: list[Listed] | None = list_entry_points(ENTRYPOINT_GROUP)
    except Exception:
        entry_points = None  # the daemon's image lists them itself and reports the error
    handed = (snapshot(settings), entry_points, dict(options or {}))
    data = pickle.dumps(handed, protocol=pickle.HIGHEST_PROTOCOL)
    fd = os.memfd_create("meshd-settings", 0)  # no MFD_CLOEXEC: the new image inherits it
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        sys.stdout.flush()
        sys.stderr.flush()
        # The interpreter's own flags (-X, -W, -O, ...) as the stdlib's multiprocessing passes them on.
        flags: list[str] = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]
        os.execv(sys.executable, [sys.executable, *flags, "-m", "meshd", *sys.argv[1:], FD_FLAG, str(fd)])
    finally:  # only reached when execv failed
        os.close(fd)


def read_settings(fd: int) -> SettingsSnapshot:
    """The snapshot the validating image left in ``fd`` (closed afterwards); raises ValueError."""
    return read_image(fd)[0]


def read_image(fd: int) -> tuple[SettingsSnapshot, dict[str, Any]]:
    """The snapshot and the run options the validating image left in ``fd`` (closed afterwards);
    the listed entry points are handed over (meshd/plugins/entrypoints.py). Raises ValueError."""
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(_MAX_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{FD_FLAG} {fd}: {exc.strerror}") from None
    if len(data) > _MAX_BYTES:
        raise ValueError(f"{FD_FLAG} {fd}: more than {_MAX_BYTES} bytes")
    try:
        value = pickle.loads(data)  # written by this same program just before execv
    except Exception as exc:
        raise ValueError(f"{FD_FLAG} {fd}: not meshd settings ({type(exc).__name__})") from None
    if not (isinstance(value, tuple) and len(value) in (2, 3) and isinstance(value[0], SettingsSnapshot)
            and (len(value) == 2 or isinstance(value[2], dict))):
        raise ValueError(f"{FD_FLAG} {fd}: not meshd settings")
    if value[1] is not None:
        hand_over(value[1])
    return value[0], (value[2] if len(value) == 3 else {})


def settings_for_run(settings_fd: int | None, argv: list[str] | None, validate: Callable[[], Settings],
                     options: Mapping[str, Any] | None = None) -> Settings | SettingsSnapshot:
    """``meshd run``'s settings: read from ``settings_fd`` in the re-exec'd image; else ``validate()``
    them (ConfigError as ever), create the state and socket dirs, and re-exec when :func:`wanted`
    (then this does not return; ``options`` travel along). A failed ``execv`` is reported and the
    daemon runs on as is."""
    if settings_fd is not None:
        return read_settings(settings_fd)
    from meshd.config.settings import ensure_dirs

    settings = validate()
    ensure_dirs(settings)
    if wanted(argv):
        try:
            exec_with_settings(settings, options)
        except OSError as exc:
            print(f"meshd: re-exec without pydantic failed ({exc}); running on as is", file=sys.stderr)
    return settings
