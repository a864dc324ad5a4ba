"""Admitting A2A agents found on the LAN: ``meshctl a2a list|trust``'s other end, and its memory.

Owns the answers to :data:`~meshd.bindings.a2a.ctl.TOPIC_LAN` requests (from agents of this
binding's own node only: ``FORBIDDEN`` otherwise), the admission itself (a discovered agent
becomes a :class:`~meshd.bindings.a2a.remote.RemoteAgent`, trusted for its card's host and port)
and the file that remembers the admissions (``a2a-NAME-admitted.json`` in the daemon's state dir,
0600, at most ``a2a.lan_max_discovered`` entries), so an admitted agent joins again after a
restart of ``meshd a2a`` without being trusted again, as a trusted mesh peer's key stays trusted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from meshd.bindings.a2a.lan import MAX_URL, Discovered
from meshd.bindings.a2a.remote import RemoteAgent
from meshd.client import DEFER, Agent
from meshd.config.sections import RemoteA2aAgent
from meshd.errors import Forbidden, MeshError, ValidationFailed

__all__ = ["LanAdmission", "card_host"]

log = logging.getLogger("meshd.a2a")


def card_host(url: str) -> str:
    """``host:port`` of a card URL (the default port of its scheme when it names none)."""
    parts = urlsplit(url)
    shown = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else str(parts.hostname)
    return f"{shown}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


class LanAdmission:
    def __init__(self, agent: Agent, lan: Any, remotes: list[RemoteAgent], *, socket: Path | None,
                 own: set[str], store: Path | None, limit: int,
                 verified: Callable[[Any], bool] | None = None,
                 stats: Callable[[], dict[str, Any]] | None = None) -> None:
        self.stats = stats or dict
        self.agent = agent
        self.lan = lan
        self.remotes = remotes
        self.socket = socket
        self.own = own
        self.store = store
        self.limit = limit
        self.verified = verified
        self._joining: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ the remembered admissions

    def remembered(self) -> dict[str, str]:
        """The admissions in the file (label -> card URL); a bad file is ignored (logged)."""
        if self.store is None or not self.store.exists():
            return {}
        try:
            data = json.loads(self.store.read_text(encoding="utf-8"))
            items = {str(k): str(v) for k, v in dict(data).items()}
        except (OSError, ValueError, TypeError) as exc:
            log.warning("ignoring %s: %s", self.store, exc)
            return {}
        return {k: v for k, v in list(items.items())[:self.limit]
                if len(v) <= MAX_URL and urlsplit(v).scheme in ("http", "https")}

    def _remember(self) -> None:
        if self.store is None:
            return
        items = {d.name: d.url for d in self.lan.discovered.values() if d.admitted}
        tmp = self.store.with_name(f".{self.store.name}.{os.getpid()}.tmp")
        try:
            self.store.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, (json.dumps(dict(list(items.items())[:self.limit])) + "\n").encode())
            finally:
                os.close(fd)
            os.replace(tmp, self.store)
        except OSError as exc:  # admitted now; only the memory of it across a restart is lost
            log.warning("cannot remember LAN admissions in %s: %s", self.store, exc.strerror or exc)

    def rejoin(self) -> None:
        """At start: every remembered admission is admitted again (joining in the background)."""
        for label, url in self.remembered().items():
            item = Discovered(label, url, "", [], admitted=True)
            self.lan.discovered[label] = item
            remote = self._remote(url)
            self.remotes.append(remote)
            task = asyncio.ensure_future(self._rejoin(remote, item))
            self._joining.add(task)
            task.add_done_callback(self._joining.discard)

    async def _rejoin(self, remote: RemoteAgent, item: Discovered) -> None:
        why = await remote.try_start(10.0)
        if why is not None:
            item.error = why
            await remote.join(why)
        self.own.add(remote.name)
        item.mesh_name, item.error = remote.name, None

    def _remote(self, url: str) -> RemoteAgent:
        return RemoteAgent(RemoteA2aAgent(url=url), [card_host(url)], self.socket, self.verified)

    # ------------------------------------------------------------------ meshctl a2a list|trust

    async def handle(self, msg: Any) -> Any:
        """The handler: a refusal goes back with its own code (FORBIDDEN, VALIDATION_FAILED), not
        as HANDLER_ERROR."""
        try:
            return await self._answer(msg)
        except MeshError as exc:
            await self.agent.fail(msg, exc, code=exc.code)
            return DEFER

    async def _answer(self, msg: Any) -> Any:
        if not await self._local(msg.sender):
            raise Forbidden("meshd a2a answers LAN requests from agents of its own node only")
        body = msg.payload if isinstance(msg.payload, dict) else {}
        if body.get("op") == "stats":
            return self.stats()
        if self.lan is None:
            raise ValidationFailed("LAN discovery is off (a2a.lan_discovery = false)")
        if body.get("op") == "list":
            return [d.view() for d in self.lan.discovered.values()]
        if body.get("op") != "trust":
            raise ValidationFailed("op must be 'list', 'trust' or 'stats'")
        item = self.lan.discovered.get(str(body.get("name")))
        if item is None:
            raise ValidationFailed(f"no discovered A2A agent {body.get('name')!r}; see meshctl a2a list")
        if item.admitted:
            return item.view()
        return await self._admit(item)

    async def _local(self, sender: str) -> bool:
        name, _, node = sender.partition("@")
        for record in await self.agent.agents():
            if record.get("name") == name:
                return bool(record.get("node") == self.agent.node and (not node or node in (
                    self.agent.node, self.agent.node_name)))
        return False

    async def _admit(self, item: Discovered) -> Any:
        remote = self._remote(item.url)
        try:
            await remote.start()
        except MeshError as exc:
            item.error = exc.message
            with contextlib.suppress(Exception):
                await remote.close()
            raise ValidationFailed(f"cannot admit {item.name}: {exc.message}") from None
        self.remotes.append(remote)
        self.own.add(remote.name)
        item.admitted, item.mesh_name, item.error = True, remote.name, None
        self._remember()
        log.info("A2A agent %s (%s) trusted by an operator: in the mesh as %r", item.name, item.url,
                 remote.name)
        return item.view()
