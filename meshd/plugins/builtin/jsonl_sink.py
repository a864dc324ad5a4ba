"""A dead-letter sink that appends one JSON line per dead letter to a file (mode 0600).

Each line is the letter's dict with ``frames`` replaced by ``frames_b64`` (each frame base64
encoded), and any bytes inside ``header`` as base64 strings, so every line parses as JSON::

    {"seq": 3, "at": 1718000000.5, "reason": "PEER_UNREACHABLE", "detail": "...", "attempts": 3,
     "header": {"kind": "direct", "id": "...", ...}, "frames_b64": ["TUVTSAE=", "...", "..."]}

It runs on the plugin worker thread, never on the routing path. A write error (disk full, file
removed with its directory) is logged once, counted in ``errors``, and the next letter tries again
with a freshly opened file; it never raises into the host.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading
from pathlib import Path
from typing import IO, Any

from meshd.hookspecs import hookimpl

__all__ = ["JsonlDeadLetterSink"]

log = logging.getLogger("meshd.plugins.jsonl_sink")

_MODE = 0o600


def _b64(data: bytes | bytearray | memoryview) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


def _jsonable(value: Any) -> Any:
    """``value`` with bytes as base64 strings, tuples/sets as lists and non-str keys as str."""
    if isinstance(value, bytes | bytearray | memoryview):
        return _b64(value)
    if isinstance(value, dict):
        return {
            (_b64(key) if isinstance(key, bytes | bytearray) else key if isinstance(key, str) else str(key)):
                _jsonable(item)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(item) for item in value]
    return value


def letter_to_json(letter: dict[str, Any]) -> str:
    """One dead letter as a single JSON line (no trailing newline)."""
    record = {key: _jsonable(item) for key, item in letter.items() if key != "frames"}
    record["frames_b64"] = [_b64(frame) for frame in letter.get("frames") or ()]
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=repr)


class JsonlDeadLetterSink:
    """Appends each dead letter to ``path`` as one JSON line, flushed per line (file mode 0600)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.written = 0
        self.errors = 0
        self._file: IO[str] | None = None
        self._lock = threading.Lock()
        self._error_logged = False

    @hookimpl
    def meshd_dead_letter(self, letter: dict[str, Any]) -> None:
        """Append ``letter`` as one JSON line."""
        try:
            line = letter_to_json(letter) + "\n"
        except Exception as exc:  # a letter that cannot be encoded must not stop the sink
            self._error(exc)
            return
        with self._lock:
            try:
                handle = self._open()
                handle.write(line)
                handle.flush()
            except OSError as exc:
                self._close_locked()
                self._error(exc)
                return
            self.written += 1
            if self._error_logged:
                log.info("dead-letter file %s is writable again", self.path)
                self._error_logged = False

    def close(self) -> None:
        """Close the file (the next dead letter reopens it)."""
        with self._lock:
            self._close_locked()

    def _open(self) -> IO[str]:
        if self._file is None:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, _MODE)
            try:
                os.fchmod(fd, _MODE)  # an older file, or one created under another umask
                self._file = os.fdopen(fd, "a", encoding="utf-8")
            except BaseException:
                os.close(fd)
                raise
        return self._file

    def _close_locked(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            try:
                handle.close()
            except OSError:
                pass

    def _error(self, exc: BaseException) -> None:
        self.errors += 1
        if not self._error_logged:
            self._error_logged = True
            log.error("cannot write dead letters to %s: %s (logged once; %d so far)",
                      self.path, exc, self.errors)
