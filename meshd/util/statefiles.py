"""The daemon's directories and private files: created with the right owner and mode, refused when
another user owns them (for root too: that user could move our socket or read our keys).

Owns: ``make_dir`` (state and runtime directories) and ``make_private_file`` (0600 files such as
``node_id``, ``delivery.db`` and its -wal/-shm). Must not touch: what goes into those files.
Errors are :class:`meshd.errors.ConfigError` naming the key, so start-up exits 2 with the fix.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from meshd.errors import ConfigError

__all__ = ["make_dir", "make_private_file"]


def _refuse(key: str, path: Path, reason: str, fix: str) -> ConfigError:
    return ConfigError(key, f"cannot start: {path}: {reason} (fix: {fix})")


def make_private_file(path: Path) -> None:
    """Create ``path`` 0600 if missing, or make an existing one 0600 (a delivery.db that others
    can read shows them every stored message). SQLite gives a database's -wal and -shm files the
    database file's mode, so calling this before ``sqlite3.connect`` makes all three private;
    existing ones are fixed."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an older file, or one created under another umask
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.chmod(side, 0o600)


def make_dir(path: Path, mode: int, key: str) -> None:
    """Create ``path`` with ``mode`` if missing; refuse another user's; tighten our own loose one."""
    try:
        if not path.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                path.mkdir(mode=mode)
                os.chmod(path, mode)  # mkdir's mode is filtered by the umask
            except FileExistsError:
                pass  # created concurrently; checked below like any existing directory
        st = path.lstat()
    except OSError as exc:
        raise ConfigError(key, f"cannot create directory {path}: {exc.strerror or exc}")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(key, f"{path} exists and is not a directory")
    # For root too: another user's directory is refused (that user could move our socket
    # or read our keys). Our own directory with a looser mode (one made by `meshctl keys`, or by
    # an older meshd, 0755) is tightened to ``mode``, with a warning: from now on others can
    # neither write into it nor read the state (keys, delivery.db).
    euid = os.geteuid()
    if euid == 0 and st.st_uid != 0:
        raise _refuse(key, path, f"owned by uid {st.st_uid}, not by root, which runs this daemon",
                      f"chown root: {path} && chmod {mode:o} {path}, or remove it")
    # A sticky, world-writable directory (/tmp, /var/tmp, /dev/shm) is everyone's: its mode is
    # never changed (a socket given as /tmp/meshd.sock once made /tmp 0750 for the whole host);
    # the sticky bit keeps others from removing or replacing what we create in it.
    shared = bool(st.st_mode & stat.S_ISVTX and st.st_mode & stat.S_IWOTH)
    if st.st_uid == euid and not shared and stat.S_IMODE(st.st_mode) & ~mode & 0o077:
        try:
            os.chmod(path, mode)
        except OSError as exc:
            raise _refuse(key, path, f"mode {stat.S_IMODE(st.st_mode):o} is too open and cannot be "
                          f"changed ({exc.strerror or exc})", f"chmod {mode:o} {path}") from None
        logging.getLogger("meshd").warning("%s had mode %o: tightened to %o (others must not read "
                                           "or write it)", path, stat.S_IMODE(st.st_mode), mode)
    uid = os.getuid()
    if uid != 0 and st.st_uid != uid:
        # In a shared, world-writable parent (the /tmp fallback) another user could have made the
        # directory first to catch our socket; refuse rather than use it.
        try:
            parent_mode = path.parent.stat().st_mode
        except OSError:
            parent_mode = 0
        if parent_mode & stat.S_IWOTH:
            raise ConfigError(key, f"{path} is owned by another user (uid {st.st_uid}); refusing to use it")
