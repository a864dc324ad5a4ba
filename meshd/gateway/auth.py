"""The gateway's bearer token and the files that tell clients where the gateway is.

Owns: ``http.token`` (a random token, mode 0600, or 0640 when the operator asks for it) and
``http.json`` (url, pid) in the runtime dir beside the agent socket; the constant-time check of
an ``Authorization`` header; the client-side lookup of both files (:func:`find_gateway`).
Must not touch: HTTP routing, sessions, the node. The token is never logged or put in a URL.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path

from meshd.errors import DaemonUnreachable
from meshd.util.paths import find_agent_socket

__all__ = ["TOKEN_FILE", "URL_FILE", "GatewayAddress", "TokenGuard", "find_gateway", "new_token",
           "remove_files", "write_token", "write_url"]

TOKEN_FILE = "http.token"
URL_FILE = "http.json"


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe), made as ``secrets.token_urlsafe(32)``
    makes it, without importing ``secrets`` (whose hmac import maps OpenSSL's libcrypto)."""
    return base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")


def _write_private(path: Path, text: str, mode: int) -> None:
    """Write ``text`` atomically to ``path`` with exactly ``mode`` (never readable in between)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # the umask filtered the mode given to open
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_token(runtime_dir: Path, token: str, *, group_readable: bool = False) -> Path:
    """Write ``http.token`` (0600, or 0640 with ``group_readable``); returns its path."""
    path = runtime_dir / TOKEN_FILE
    _write_private(path, token + "\n", 0o640 if group_readable else 0o600)
    return path


def write_url(runtime_dir: Path, url: str, *, group_readable: bool = False) -> Path:
    """Write ``http.json``: ``{"url": ..., "pid": ...}``; same mode as the token file."""
    path = runtime_dir / URL_FILE
    _write_private(path, json.dumps({"url": url, "pid": os.getpid()}) + "\n",
                   0o640 if group_readable else 0o600)
    return path


def remove_files(runtime_dir: Path) -> None:
    """Remove both files (on shutdown), if they are still ours."""
    for name in (URL_FILE, TOKEN_FILE):
        try:
            (runtime_dir / name).unlink()
        except FileNotFoundError:
            pass


class TokenGuard:
    """Holds the current token and checks ``Authorization: Bearer ...`` headers in constant time."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()
        self.refused = 0

    def replace(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

    def check(self, header: str | None) -> bool:
        """True when ``header`` carries the current token; counts refusals."""
        import hmac  # at the first request (aiohttp has loaded OpenSSL by then), not at start

        given = (header or "").encode("utf-8", "replace")
        ok = hmac.compare_digest(given, self._expected)
        if not ok:
            self.refused += 1
        return ok


@dataclass(frozen=True)
class GatewayAddress:
    """Where a daemon's gateway listens and the token it wants."""

    url: str
    token: str


def find_gateway(socket: Path | None = None) -> GatewayAddress:
    """Read ``http.json`` and ``http.token`` beside the agent socket (default: the one
    :func:`meshd.config.find_agent_socket` finds, as for ``Agent()``).

    Raises :class:`DaemonUnreachable` when the daemon runs without a gateway or is not running.
    """
    runtime_dir = (socket or find_agent_socket()).parent
    try:
        info = json.loads((runtime_dir / URL_FILE).read_text())
        token = (runtime_dir / TOKEN_FILE).read_text().strip()
    except (OSError, ValueError) as exc:
        raise DaemonUnreachable(f"no meshd HTTP gateway in {runtime_dir} ({exc.__class__.__name__}: "
                                "is meshd running with http enabled?)")
    url = info.get("url") if isinstance(info, dict) else None
    if not isinstance(url, str) or not token:
        raise DaemonUnreachable(f"{runtime_dir / URL_FILE} or {TOKEN_FILE} is incomplete")
    return GatewayAddress(url, token)
