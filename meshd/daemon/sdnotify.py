"""systemd's notify protocol (sd_notify), without libsystemd: one datagram per state change.

Under ``Type=notify`` systemd sets ``NOTIFY_SOCKET``; the daemon sends ``READY=1`` once its
sockets are bound and discovery runs, ``STATUS=...`` lines as peers and agents change,
``WATCHDOG=1`` at half of ``WatchdogSec`` and ``STOPPING=1`` when it begins to shut down.
Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger("meshd.sdnotify")


class Notifier:
    """Sends sd_notify datagrams to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address: str | None = env.get("NOTIFY_SOCKET") or None
        self._watchdog_usec = 0
        try:
            usec = int(env.get("WATCHDOG_USEC", "0"))
            pid = env.get("WATCHDOG_PID")
            if usec > 0 and (pid is None or int(pid) == os.getpid()):
                self._watchdog_usec = usec
        except ValueError:
            log.warning("ignoring malformed WATCHDOG_USEC/WATCHDOG_PID")
        self._sock: socket.socket | None = None
        self.sent = 0
        self.failed = 0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings (half of WatchdogSec), or None when not asked for."""
        return self._watchdog_usec / 2e6 if self._watchdog_usec else None

    def notify(self, *lines: str) -> bool:
        """Send one datagram of ``KEY=VALUE`` lines; False (and counted) if it could not be sent."""
        if self.address is None:
            return False
        addr = self.address
        if addr.startswith("@"):
            addr = "\0" + addr[1:]
        try:
            if self._sock is None:
                # Non-blocking: a receiver that stopped reading must never stall the event loop
                # (a unix datagram send blocks when the receiver's queue is full).
                self._sock = socket.socket(socket.AF_UNIX,
                                           socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
            self._sock.sendto("\n".join(lines).encode(), addr)
            self.sent += 1
            return True
        except OSError as exc:
            self.failed += 1
            if self.failed == 1:
                log.warning("sd_notify to %s failed: %s", self.address, exc)
            return False

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def stopping(self, status: str = "stopping") -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
