"""The gateway's listening sockets: bound at start, aiohttp loaded at the first connection.

Owns: binding ``http_host``:``http_port`` the way aiohttp's TCPSite does (``loop.create_server``:
one socket per address the host resolves to, SO_REUSEADDR, IPV6_V6ONLY on IPv6, backlog 128,
non-blocking), reporting the bound port, and calling its owner back once, when the first
connection is pending. Until then the daemon has not imported aiohttp (about 9 MiB resident,
which an idle daemon should not pay): the port is bound and the URL and token files are written
at start as before, and a client that connects meanwhile waits in the kernel's backlog until
aiohttp accepts it (``web.SockSite`` on these same sockets).

Must not import aiohttp or the application (meshd/gateway/app.py) at import time, nor touch
anything but its own sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

__all__ = ["BACKLOG", "PendingListener"]

BACKLOG = 128  # aiohttp's TCPSite default


class PendingListener:
    """Listening sockets for ``host``:``port`` whose first pending connection calls ``on_first``."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.sockets: list[socket.socket] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_first: Callable[[], None] | None = None

    def bind(self) -> None:
        """Bind and listen on every address ``host`` resolves to; raises OSError like create_server."""
        # An ASCII host as bytes: for a str, getaddrinfo always loads the idna codec (encodings.idna,
        # stringprep, unicodedata: ~0.4 MiB resident that the daemon never needs otherwise).
        host: str | bytes = self.host.encode("ascii") if self.host.isascii() else self.host
        infos = socket.getaddrinfo(host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        seen: set[tuple[int, object]] = set()
        try:
            for family, kind, proto, _name, addr in infos:
                if (family, addr) in seen:
                    continue
                seen.add((family, addr))
                sock = socket.socket(family, kind, proto)
                self.sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    sock.bind(addr)
                except OSError as exc:
                    raise OSError(exc.errno, f"error while attempting to bind on address "
                                             f"{addr!r}: {exc.strerror}") from None
                sock.listen(BACKLOG)
                sock.setblocking(False)
        except BaseException:
            self.close()
            raise

    def bound_port(self) -> int:
        """The port of the first socket (the one the gateway's URL names)."""
        for sock in self.sockets:
            return int(sock.getsockname()[1])
        raise RuntimeError("the HTTP gateway has no bound address")

    def on_first_connection(self, loop: asyncio.AbstractEventLoop, on_first: Callable[[], None]) -> None:
        """Call ``on_first`` once, on ``loop``, when any socket has a connection pending."""
        self._loop, self._on_first = loop, on_first
        for sock in self.sockets:
            loop.add_reader(sock.fileno(), self._fire)

    def _fire(self) -> None:
        on_first = self._on_first
        self._stop_watching()
        if on_first is not None:
            on_first()

    def _stop_watching(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            for sock in self.sockets:
                if sock.fileno() >= 0:
                    self._loop.remove_reader(sock.fileno())
        self._loop, self._on_first = None, None

    def hand_over(self) -> list[socket.socket]:
        """The sockets, for the HTTP server that serves them from now on (it closes them)."""
        self._stop_watching()
        socks, self.sockets = self.sockets, []
        return socks

    def close(self) -> None:
        """Stop watching and close the sockets not handed over (pending connections are refused)."""
        self._stop_watching()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self.sockets = []
