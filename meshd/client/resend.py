"""The client's resend hold across a daemon restart, and the re-registration that ends it.

qos-1 sends wait in their own coroutines (``until_released``, see ``Agent.send``): a restarted
daemon that refused one with NOT_REGISTERED stored nothing, so it is sent again, with the same
id, once the agent has registered again. What this module holds itself are qos-0 sends:

Owns: the last ``RESEND_WINDOW`` qos-0 sends at least (two generations, each bounded by count
and by bytes), the sends a
restarted daemon refused with NOT_REGISTERED (held, at most ``RESEND_WINDOW``, until the agent
has registered again), the qos-0 sends made while re-registering (``holding``: held in the
same bound, in order, never written to a socket the daemon is about to close), and the
re-registration loop: jittered backoff when the daemon does not answer, and, while it answers
DAEMON_STOPPING, tries every ``retry_after`` for at most ``RESTART_WAIT`` seconds.

Must not touch: the socket, the batcher's queues, the futures of pending calls, the handler
table. It sends again and reports through the callbacks the ``Agent`` (meshd/client/agent.py) gives
it; the ``Agent`` owns it (composition).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from meshd.client.batching import BatchKey
from meshd.errors import DaemonStopping, DaemonUnreachable, MeshError, RequestTimeout
from meshd.util.backoff import backoff_delay

log = logging.getLogger("meshd.client")

REREGISTER_ATTEMPTS = 5
"""Tries to register again after the daemon forgot this agent (it restarted), with jittered backoff."""
RESEND_WINDOW = 1000
RESEND_WINDOW_BYTES = 8 * 1024 * 1024
"""The last qos-0 sends kept so that one the daemon refused with NOT_REGISTERED (it restarted and
forgot this agent) is sent again after registering again: two generations of at most this many
and bytes each (so at least the last this many, or this many bytes, and at most twice that). The
same bound (once) holds the sends refused and those made while registering again."""
RESTART_WAIT = 30.0
"""How long the client keeps registering again while its daemon answers DAEMON_STOPPING (it is
stopping, or the next one is not up yet); then what it holds is reported to ``on_error``."""

SentItem = tuple[BatchKey, dict[str, Any], bytes]
"""A qos-0 send as it was enqueued: its batch key, header and encoded payload."""


class ResendHold:
    """Recent qos-0 sends, the ones a restarted daemon refused, and the re-registration."""

    def __init__(self, name: str, *, enqueue: Callable[[BatchKey, dict[str, Any], bytes], None],
                 report: Callable[[MeshError, str], None]) -> None:
        self.name = name
        self._enqueue = enqueue
        self._report = report
        #: The recent qos-0 sends by id, this generation and the one before (``remember``).
        self.recent: dict[str, SentItem] = {}
        self.recent_bytes = 0  # of this generation
        self.recent_before: dict[str, SentItem] = {}
        self.held: list[tuple[str, SentItem]] = []
        self.held_bytes = 0
        #: Sends made while re-registering, after those refused (``held``): sent in this order.
        self.held_new: list[tuple[str, SentItem]] = []
        self.reregistering = False
        #: Set from the stop notice (or NOT_REGISTERED) until the agent is registered again: new
        #: qos-0 sends are held here instead of written to the socket.
        self.holding = False
        self._released = asyncio.Event()
        #: Why the last re-registration failed (None: it succeeded): what a held qos-1 send raises.
        self.release_error: MeshError | None = None

    def remember(self, msg_id: str, item: SentItem) -> None:
        """Keep a qos-0 send for a while: if the daemon refuses it NOT_REGISTERED, it goes again.

        Called for every qos-0 send through a daemon, so it is a dict store and two compares: a
        full generation becomes the one before and the older one is dropped whole (0.1 us instead
        of 0.3-0.45 us with an ordered dict trimmed per send, bench/send_path.py)."""
        recent = self.recent
        recent[msg_id] = item
        self.recent_bytes += len(item[2])
        if len(recent) >= RESEND_WINDOW or self.recent_bytes >= RESEND_WINDOW_BYTES:
            self.recent_before, self.recent, self.recent_bytes = recent, {}, 0

    def full(self) -> bool:
        """The hold is at its bound (``RESEND_WINDOW`` sends or ``RESEND_WINDOW_BYTES``)."""
        return (len(self.held) + len(self.held_new) >= RESEND_WINDOW
                or self.held_bytes >= RESEND_WINDOW_BYTES)

    def hold(self, targets: list[Any]) -> list[Any]:
        """Hold the refused qos-0 sends we still have (sent again after registering again);
        return the targets we cannot send again (they are reported)."""
        rest = []
        for target in targets:
            item = self.recent.pop(str(target), None) if target is not None else None
            if item is not None:
                self.recent_bytes -= len(item[2])
            elif target is not None:
                item = self.recent_before.pop(str(target), None)
            if item is None:
                rest.append(target)
                continue
            if self.full():
                rest.append(target)
                continue
            self.held.append((str(target), item))
            self.held_bytes += len(item[2])
        return rest

    async def hold_new(self, msg_id: str, item: SentItem) -> bool:
        """While ``holding``: keep a new qos-0 send for after the re-registration, waiting while
        the hold is full (bounded: the re-registration ends within ``RESTART_WAIT`` or its
        attempts). False if holding ended meanwhile: the caller sends it the usual way."""
        while self.holding and self.full():
            self._released.clear()
            await self._released.wait()
        if not self.holding:
            return False
        self.held_new.append((msg_id, item))
        self.held_bytes += len(item[2])
        return True

    async def until_released(self) -> MeshError | None:
        """Wait while ``holding`` (a qos-1 send waits here, in its own coroutine, bounded as the
        re-registration is); the re-registration's error, or None once registered again."""
        while self.holding:
            self._released.clear()
            await self._released.wait()
        return self.release_error

    def release(self, err: MeshError | None) -> None:
        """Registered again: send what was held (``err`` None), or report each one (``err``)."""
        held, self.held, self.held_new = self.held + self.held_new, [], []
        self.held_bytes = 0
        self.holding = False
        self.release_error = err
        self._released.set()
        for msg_id, (key, header, data) in held:
            if err is None:
                self._enqueue(key, header, data)
                self.remember(msg_id, (key, header, data))
            else:
                self._report(err, msg_id)
        if held and err is None:
            log.info("agent %s sent again %d message(s) its restarted daemon had refused", self.name,
                     len(held))

    def start(self) -> bool:
        """Begin holding new sends; True if the caller must spawn :meth:`reregister` (one at a
        time: ``reregistering`` is set now, not when the task starts)."""
        self.holding = True
        if self.reregistering:
            return False
        self.reregistering = True
        return True

    async def reregister(self, register: Callable[[], Awaitable[None]],
                         closed: Callable[[], bool]) -> None:
        """Register again (``register`` also restores the subscriptions), then release the hold.
        The caller sets ``reregistering`` before it spawns this (:meth:`start`), so only one runs
        at a time. A DAEMON_STOPPING answer (the old daemon is still stopping) is no failed
        attempt: it tries again after ``retry_after``, for at most ``RESTART_WAIT`` seconds."""
        end = time.monotonic() + RESTART_WAIT
        attempt = 0
        try:
            while True:
                try:
                    await register()
                    log.info("agent %s registered again after a daemon restart", self.name)
                    self.release(None)
                    return
                except DaemonStopping as exc:
                    if closed() or time.monotonic() > end:
                        log.warning("agent %s could not register again: %s", self.name, exc)
                        self.release(exc)
                        return
                    await asyncio.sleep(min(exc.retry_after or 0.2, 1.0))
                    continue
                except (DaemonUnreachable, RequestTimeout) as exc:
                    attempt += 1
                    if attempt == REREGISTER_ATTEMPTS or closed():
                        log.warning("agent %s could not register again: %s", self.name, exc)
                        self.release(exc)
                        return
                    await asyncio.sleep(backoff_delay(attempt, 0.2, 5.0))
                except MeshError as exc:  # NAME_TAKEN and the like: trying again will not help
                    log.warning("agent %s could not register again: %s", self.name, exc)
                    self.release(exc)
                    return
        finally:
            self.reregistering = False
