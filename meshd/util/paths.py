"""Where the daemon's agent socket lives by default: the runtime dir and the socket path.

Owns: the default runtime directory and agent socket path (``$MESHD_SOCKET``,
``$RUNTIME_DIRECTORY``, ``$XDG_RUNTIME_DIR``), shared by the daemon, meshctl and the client.
Standard library only: the agent client imports it, and importing the client must not pull in
the daemon's dependencies (pydantic, pluggy, zeroconf). Must not touch: the config file,
validation or anything else of :mod:`meshd.config`, which re-exports these names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = ["SYSTEMD_SOCKET", "default_runtime_dir", "default_socket_path", "find_agent_socket"]


def _env_dir(environ: Mapping[str, str], var: str) -> Path | None:
    """An absolute directory from ``var`` (first entry if ``:``-separated), or None if unset/relative."""
    value = environ.get(var, "").split(":", 1)[0].strip()
    if not value or not os.path.isabs(value):
        return None
    return Path(value)


def default_runtime_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the agent socket lives: ``$RUNTIME_DIRECTORY`` (systemd), else ``$XDG_RUNTIME_DIR/meshd``,
    else ``/tmp/meshd-<uid>``."""
    env = os.environ if environ is None else environ
    runtime = _env_dir(env, "RUNTIME_DIRECTORY")
    if runtime is not None:
        return runtime
    xdg = _env_dir(env, "XDG_RUNTIME_DIR")
    if xdg is not None:
        return xdg / "meshd"
    return Path(f"/tmp/meshd-{os.getuid()}")


def default_socket_path(environ: Mapping[str, str] | None = None) -> Path:
    """The local agent socket path used by the daemon, the client library and meshctl alike.

    ``$MESHD_SOCKET`` wins when set, so agents find a daemon started with ``--socket`` too.
    """
    env = os.environ if environ is None else environ
    if env.get("MESHD_SOCKET"):
        return Path(env["MESHD_SOCKET"]).expanduser()
    return default_runtime_dir(environ) / "meshd.sock"


#: Where the systemd unit (systemd/meshd.service, RuntimeDirectory=meshd) puts the agent socket.
SYSTEMD_SOCKET = Path("/run/meshd/meshd.sock")


def find_agent_socket(environ: Mapping[str, str] | None = None,
                      systemd_socket: Path | None = None) -> Path:
    """The socket clients (``Agent``, meshctl, ``find_gateway``) talk to when given none.

    ``$MESHD_SOCKET``, else ``$RUNTIME_DIRECTORY/meshd.sock``, else the systemd service's socket when its
    directory ``/run/meshd`` exists (even if this user may not enter it: the permission error then names
    it), else the daemon's own default (``$XDG_RUNTIME_DIR/meshd/meshd.sock``, ``/tmp/meshd-<uid>/...``).
    The daemon itself never looks at the systemd location: its default is unchanged.
    ``systemd_socket`` defaults to :data:`SYSTEMD_SOCKET`, read at each call.
    """
    env = os.environ if environ is None else environ
    if env.get("MESHD_SOCKET") or _env_dir(env, "RUNTIME_DIRECTORY") is not None:
        return default_socket_path(env)
    if systemd_socket is None:
        systemd_socket = SYSTEMD_SOCKET
    if systemd_socket.parent.is_dir():
        return systemd_socket
    return default_socket_path(env)

