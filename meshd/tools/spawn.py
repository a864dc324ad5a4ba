"""The spawner: start agent processes from the config's templates and supervise them.

Owns the children of one daemon: starting them (only ``[[spawn.templates]]`` from the config, never
a command from a tool call), the quotas (``max_instances`` per template, ``spawn.max_children`` in
all), copying their output to the daemon's log line by line (each line cut at
``spawn.log_line_bytes``), reporting a child that exits and restarting it when its template says
so (with :func:`meshd.util.backoff.backoff_delay`, at most ``spawn.max_restarts`` times), and stopping
them all when the daemon stops. A child never outlives the daemon: it runs in its own process
group, which ``stop_all`` terminates, and the kernel sends it SIGKILL if the daemon dies first
(``PR_SET_PDEATHSIG``); under systemd it also stays in the service's cgroup.

It must not register agents, route messages or decide who may spawn: the tools (approval, quotas
per caller) do that before calling :meth:`Spawner.spawn`. A plugin can replace it through the
``meshd_spawner`` hook (:func:`make_spawner`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from meshd.errors import NoSuchTemplate, SpawnFailed, SpawnQuota, ValidationFailed
from meshd.util.backoff import backoff_delay
from meshd.wire import protocol as P

if TYPE_CHECKING:  # meshd.config imports pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.config.settings import Settings, SpawnTemplate

__all__ = ["Spawner", "SpawnerLike", "make_spawner"]

log = logging.getLogger("meshd.spawn")

_PR_SET_PDEATHSIG = 1
_HISTORY = 100  # finished children kept for list()
_ACTIVE = frozenset({"running", "restarting"})


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec function that makes the kernel SIGKILL the child when the daemon dies (Linux)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        prctl = ctypes.CDLL(name, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:  # runs in the child between fork and exec: nothing but two syscalls
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the daemon died before prctl took effect
            os._exit(1)

    return preexec


class SpawnerLike(Protocol):
    """What the tools need from a spawner (a ``meshd_spawner`` plugin returns one of these)."""

    async def spawn(self, template: str, *, requester: str, name: str | None = None) -> dict[str, Any]: ...

    def list(self) -> list[dict[str, Any]]: ...

    async def stop_all(self) -> None: ...


@dataclass(eq=False)
class _Child:
    id: str
    name: str
    template: SpawnTemplate
    requester: str
    started_at: float
    state: str = "running"
    pid: int | None = None
    returncode: int | None = None
    restarts: int = 0
    proc: asyncio.subprocess.Process | None = None
    supervisor: asyncio.Task[None] | None = None
    lines: int = 0
    cut_lines: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "template": self.template.name,
                "requester": self.requester, "state": self.state, "pid": self.pid,
                "returncode": self.returncode, "restarts": self.restarts,
                "capabilities": list(self.template.capabilities), "started_at": self.started_at,
                "log_lines": self.lines}


class Spawner:
    """Starts and supervises agent children from ``settings.spawn.templates``."""

    def __init__(self, settings: Settings, socket_path: Path,
                 emit: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.settings = settings
        self.limits = settings.spawn
        self.socket_path = socket_path
        self._emit = emit
        self.templates = {t.name: t for t in settings.spawn.templates}
        self._children: dict[str, _Child] = {}
        self._history: deque[_Child] = deque(maxlen=_HISTORY)
        self._ids = itertools.count(1)
        self._stopping = False
        self._preexec = _pdeathsig_preexec()

    # ------------------------------------------------------------------ the interface

    async def spawn(self, template: str, *, requester: str, name: str | None = None) -> dict[str, Any]:
        """Start one child of ``template``; returns its record once the process runs.

        Raises NoSuchTemplate (not in the config), SpawnQuota (``max_instances`` of it, or
        ``spawn.max_children`` in all, already run), ValidationFailed (a bad or taken name) or
        SpawnFailed (the command could not be started).
        """
        if self._stopping:
            raise SpawnFailed("the daemon is stopping")
        spec = self.templates.get(template)
        if spec is None:
            known = ", ".join(sorted(self.templates)) or "none are configured"
            raise NoSuchTemplate(
                f"no spawn template {template!r} in the config ([[spawn.templates]]: {known})")
        active = [c for c in self._children.values() if c.state in _ACTIVE]
        mine = sum(1 for c in active if c.template.name == template)
        if mine >= spec.max_instances:
            raise SpawnQuota(
                f"template {template!r} already runs {mine} of max_instances = {spec.max_instances}")
        if len(active) >= self.limits.max_children:
            raise SpawnQuota(f"{len(active)} children run, spawn.max_children = {self.limits.max_children}")
        number = next(self._ids)
        child_name = name if name is not None else f"{template}-{number}"
        if not P.valid_name(child_name):
            raise ValidationFailed(f"name: {child_name!r} is not a valid agent name")
        if any(c.name == child_name for c in active):
            raise ValidationFailed(f"name: a spawned agent named {child_name!r} already runs")
        child = _Child(id=f"c{number}", name=child_name, template=spec, requester=requester,
                       started_at=time.time())
        await self._start(child)
        self._children[child.id] = child
        child.supervisor = asyncio.ensure_future(self._supervise(child))
        self._event("started", child)
        return child.record()

    def list(self) -> list[dict[str, Any]]:
        """Running children, then recently finished ones."""
        return [c.record() for c in self._children.values()] + [c.record() for c in self._history]

    async def stop_all(self) -> None:
        """SIGTERM every child's process group, SIGKILL what is left after ``stop_timeout``."""
        self._stopping = True
        children = list(self._children.values())
        for child in children:
            self._signal(child, signal.SIGTERM)
        end = time.monotonic() + self.limits.stop_timeout
        for child in children:
            if child.proc is not None and child.proc.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(child.proc.wait(), max(0.0, end - time.monotonic()))
        for child in children:
            if child.proc is not None and child.proc.returncode is None:
                log.warning("spawned agent %s (pid %s) ignored SIGTERM; killing it", child.name, child.pid)
            self._signal(child, signal.SIGKILL)  # the whole group: grandchildren too
        for child in children:
            if child.supervisor is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(child.supervisor, 5)

    def stopping(self) -> bool:
        """Whether ``stop_all`` has begun (no new children, no restarts)."""
        return self._stopping

    # ------------------------------------------------------------------ internals

    def _env(self, child: _Child) -> dict[str, str]:
        env = dict(os.environ)
        env.update(child.template.env)
        env.update({"MESHD_SOCKET": str(self.socket_path), "MESHD_AGENT_NAME": child.name,
                    "MESHD_CAPABILITIES": ",".join(child.template.capabilities),
                    "MESHD_SPAWNED_BY": child.requester})
        return env

    async def _start(self, child: _Child) -> None:
        spec = child.template
        cwd = spec.cwd or self.settings.state_dir
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, cwd=str(cwd), env=self._env(child),
                start_new_session=True, preexec_fn=self._preexec)
        except (OSError, ValueError, TypeError) as exc:
            raise SpawnFailed(f"template {spec.name!r}: cannot start {spec.command[0]!r}: {exc}") from None
        child.proc = proc
        child.pid = proc.pid
        child.state = "running"
        child.returncode = None
        log.info("spawned agent %s (template %s, pid %d) for %s", child.name, spec.name, proc.pid,
                 child.requester)

    def _signal(self, child: _Child, sig: int) -> None:
        proc = child.proc
        if proc is None or child.pid is None:
            return
        try:
            os.killpg(child.pid, sig)  # its own group (start_new_session): grandchildren too
        except ProcessLookupError:
            pass
        except PermissionError:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)

    async def _pump(self, child: _Child) -> None:
        """Copy the child's output to the log, one line per record, each cut at log_line_bytes."""
        proc = child.proc
        if proc is None or proc.stdout is None:
            return
        limit = self.limits.log_line_bytes
        buf = b""
        skipping = False
        while True:
            chunk = await proc.stdout.read(65536)
            if not chunk:
                break
            buf += chunk
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > limit:
                        if not skipping:
                            self._log_line(child, buf[:limit], cut=True)
                        skipping = True
                        buf = b""
                    break
                line, buf = buf[:nl], buf[nl + 1:]
                if not skipping:
                    self._log_line(child, line[:limit], cut=len(line) > limit)
                skipping = False
        if buf and not skipping:
            self._log_line(child, buf[:limit], cut=len(buf) > limit)

    def _log_line(self, child: _Child, line: bytes, cut: bool) -> None:
        child.lines += 1
        if cut:
            child.cut_lines += 1
        text = line.decode("utf-8", "replace").rstrip("\r")
        log.info("[%s] %s%s", child.name, text, " [cut]" if cut else "")

    async def _supervise(self, child: _Child) -> None:
        while True:
            proc = child.proc
            assert proc is not None
            pump = asyncio.ensure_future(self._pump(child))
            code = await proc.wait()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(pump, 2)
            child.returncode = code
            policy = child.template.restart
            restart = policy == "always" or (policy == "on-failure" and code != 0)
            if self._stopping:
                child.state = "stopped"
                self._event("stopped", child)
                break
            log.warning("spawned agent %s (pid %s) exited with %s", child.name, child.pid, code)
            if not restart or child.restarts >= self.limits.max_restarts:
                child.state = "exited" if code == 0 else "crashed"
                self._event(child.state, child, will_restart=False)
                break
            child.state = "restarting"
            child.restarts += 1
            self._event("crashed" if code != 0 else "exited", child, will_restart=True)
            await asyncio.sleep(backoff_delay(child.restarts, 0.5, 30.0))
            if self.stopping():  # stop_all may have begun while we slept
                child.state = "stopped"
                break
            try:
                await self._start(child)
            except SpawnFailed as exc:
                log.error("spawned agent %s: restart failed: %s", child.name, exc)
                child.state = "crashed"
                self._event("crashed", child, will_restart=False, error=exc.message)
                break
            self._event("restarted", child)
        self._children.pop(child.id, None)
        self._history.append(child)

    def _event(self, name: str, child: _Child, **extra: Any) -> None:
        if self._emit is None:
            return
        data = child.record() | extra | {"event": f"spawn.{name}"}
        try:
            self._emit(f"spawn.{name}", data)
        except Exception:
            log.exception("emitting spawn.%s failed", name)


def make_spawner(settings: Settings, socket_path: Path,
                 emit: Callable[[str, dict[str, Any]], None] | None = None,
                 plugins: Any = None) -> SpawnerLike:
    """The spawner a ``meshd_spawner`` plugin offers, else the built-in :class:`Spawner`."""
    if plugins is not None:
        offered = plugins.spawner(settings=settings, socket_path=socket_path, emit=emit)
        if offered is not None:
            return offered  # type: ignore[no-any-return]
    return Spawner(settings, socket_path, emit)
