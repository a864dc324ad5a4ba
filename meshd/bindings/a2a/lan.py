"""A2A agents on the LAN: DNS-SD ``_a2a._tcp`` (the draft the A2A project asked for, a2aproject/A2A
issue 378), advertised and browsed by ``meshd a2a``.

Owns both sides of it. Advertising: one service instance per served mesh agent, its TXT record
carrying the card URL (``url``), the agent's name, the protocol version, the mesh and this
binding's id, on the configured interfaces only (``a2a.lan_interfaces``; default the listen
address). Browsing: every other instance is kept as **discovered, not admitted** (bounded by
``a2a.lan_max_discovered``; the oldest goes, counted): nothing is fetched from it and nothing of
it joins the mesh until an operator trusts it (``meshctl a2a trust NAME``), the rule untrusted
mesh peers follow. Instances of this binding and of bindings of the same mesh are skipped (their
agents are in the mesh already). Must not touch the mesh; admitting is the caller's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

__all__ = ["MAX_ADVERTISED", "SERVICE_TYPE", "Discovered", "LanDiscovery"]

log = logging.getLogger("meshd.a2a")

SERVICE_TYPE: Final = "_a2a._tcp.local."
MAX_ADVERTISED: Final = 256
MAX_URL: Final = 512
RESOLVE_TIMEOUT_MS: Final = 1500


@dataclass(slots=True)
class Discovered:
    """One ``_a2a._tcp`` instance seen on the LAN."""

    name: str  # the instance label: what ``meshctl a2a trust`` names
    url: str
    agent: str
    addresses: list[str]
    seen: float = field(default_factory=time.monotonic)
    admitted: bool = False
    mesh_name: str | None = None  # the mesh agent it became, once admitted
    error: str | None = None

    def view(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "agent": self.agent, "addresses": self.addresses,
                "admitted": self.admitted, "mesh_name": self.mesh_name, "error": self.error,
                "seen_s_ago": round(time.monotonic() - self.seen, 1)}


def _label(text: str) -> str:
    """A DNS-SD instance label: at most 63 bytes, no dots."""
    return text.replace(".", "-")[:63]


class LanDiscovery:
    def __init__(self, interfaces: list[str], *, binding_id: str, mesh: str, max_discovered: int) -> None:
        self.interfaces = interfaces
        self.binding_id = binding_id
        self.mesh = mesh
        self.max_discovered = max_discovered
        self.discovered: collections.OrderedDict[str, Discovered] = collections.OrderedDict()
        self.dropped = 0
        self.ignored = 0
        self._aiozc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._advertised: dict[str, AsyncServiceInfo] = {}  # agent name -> its registration
        self._resolving: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._aiozc = AsyncZeroconf(interfaces=list(self.interfaces), ip_version=IPVersion.V4Only)
        self._browser = AsyncServiceBrowser(self._aiozc.zeroconf, SERVICE_TYPE, handlers=[self._on_change])
        log.info("A2A LAN discovery (%s) on %s", SERVICE_TYPE, ", ".join(self.interfaces))

    async def stop(self) -> None:
        aiozc, self._aiozc = self._aiozc, None
        if aiozc is None:
            return
        for task in list(self._resolving):
            task.cancel()
        if self._browser is not None:
            with contextlib.suppress(Exception):
                await self._browser.async_cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(aiozc.async_unregister_all_services(), 2.0)
        await aiozc.async_close()

    def _instance(self, agent: str) -> str:
        return f"{_label(agent + '-' + self.binding_id)}.{SERVICE_TYPE}"

    async def advertise(self, cards: dict[str, str], port: int) -> None:
        """Make the advertised set ``cards`` (agent name -> card URL): new ones registered, gone
        ones said goodbye to; at most :data:`MAX_ADVERTISED`."""
        if self._aiozc is None:
            return
        wanted = dict(list(cards.items())[:MAX_ADVERTISED])
        for agent in [a for a in self._advertised if a not in wanted]:
            with contextlib.suppress(Exception):
                goodbye = await self._aiozc.async_unregister_service(self._advertised.pop(agent))
                await goodbye
        for agent, url in wanted.items():
            if agent in self._advertised:
                continue
            info = AsyncServiceInfo(
                SERVICE_TYPE, self._instance(agent), port=port,
                properties={"url": url, "name": agent[:128], "proto": "1.0", "mesh": self.mesh,
                            "bid": self.binding_id},
                server=f"meshd-a2a-{self.binding_id}.local.",
                addresses=[socket.inet_aton(a) for a in self.interfaces])
            try:
                announced = await self._aiozc.async_register_service(info, cooperating_responders=True)
                await announced
            except Exception as exc:  # a name clash on the LAN: this agent is not advertised
                log.warning("cannot advertise %s: %s", info.name, exc)
                continue
            self._advertised[agent] = info

    @property
    def advertised(self) -> list[str]:
        return list(self._advertised)

    def _on_change(self, zeroconf: Zeroconf, service_type: str, name: str,
                   state_change: ServiceStateChange) -> None:
        label = name.removesuffix("." + SERVICE_TYPE)
        if state_change is ServiceStateChange.Removed:
            item = self.discovered.get(label)
            if item is not None and not item.admitted:
                del self.discovered[label]
            return
        task = asyncio.get_running_loop().create_task(self._resolve(zeroconf, name, label))
        self._resolving.add(task)
        task.add_done_callback(self._resolving.discard)

    async def _resolve(self, zc: Zeroconf, name: str, label: str) -> None:
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        if not await info.async_request(zc, RESOLVE_TIMEOUT_MS):
            return
        props = {k.decode(errors="replace"): (v or b"").decode(errors="replace")
                 for k, v in (info.properties or {}).items()}
        if props.get("bid") == self.binding_id or props.get("mesh") == self.mesh:
            return  # ours, or a binding of this mesh: its agents are mesh agents already
        url = props.get("url", "")
        if len(url) > MAX_URL or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
            self.ignored += 1
            return
        item = self.discovered.get(label)
        if item is not None and item.admitted:
            item.seen = time.monotonic()
            return
        self.discovered[label] = Discovered(label, url, props.get("name", "")[:128],
                                            info.parsed_addresses(IPVersion.V4Only))
        self.discovered.move_to_end(label)
        while len(self.discovered) > self.max_discovered:
            oldest = next((k for k, v in self.discovered.items() if not v.admitted), None)
            if oldest is None:
                break
            del self.discovered[oldest]
            self.dropped += 1
