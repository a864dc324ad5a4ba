"""The address watcher: this host's interface addresses, followed while the daemon runs.

Every ``address_poll_interval`` seconds it reads the addresses meshd should use (the configured
``interfaces`` that exist now, or :func:`meshd.discovery.default_interfaces` re-evaluated, so an
interface that appears later joins with the same exclusions as at start). When that list
changes (a DHCP lease moved the address, Wi-Fi roamed, a USB interface came) it re-binds the
mesh ROUTER and XPUB on the new addresses (same ports) and unbinds the old ones, re-announces the
mDNS service with the new addresses (A records carry the cache-flush bit, so peers replace the
old address), and has the peer table re-dial every peer from the new address and greet it with
the new endpoints (HELLO), so peers re-dial us too.

Polling, not netlink: reading the addresses costs well under a millisecond, needs no extra
dependency or privilege, works the same in every network namespace, and a 2-s period keeps
recovery within a few seconds; netlink events would save only that delay.

Owns: the poll loop and the re-bind of the two mesh server sockets. It must not route, judge
peers or parse anything: discovery and the peer table do their own part when called.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ifaddr
import zmq

if TYPE_CHECKING:
    from meshd.config.settings import Settings
    from meshd.discovery.mdns import Discovery
    from meshd.mesh.peers import PeerTable

__all__ = ["AddressWatcher", "present_addresses"]

log = logging.getLogger("meshd.node")


def present_addresses() -> set[str]:
    """Every IPv4 address on this host's interfaces now."""
    return {ip.ip for adapter in ifaddr.get_adapters() for ip in adapter.ips if isinstance(ip.ip, str)}


class AddressWatcher:
    """Follow this host's addresses; re-bind, re-advertise and re-greet when they change."""

    def __init__(self, settings: Settings, interfaces: list[str], *, router: zmq.Socket[Any],
                 xpub: zmq.Socket[Any], ports: Callable[[], tuple[int, int]],
                 discovery: Callable[[], Discovery | None], peer_table: PeerTable,
                 defaults: Callable[[], list[str]]) -> None:
        self.settings = settings
        self.interfaces = interfaces  # the node's list, changed in place (the peer table shares it)
        self.router = router
        self.xpub = xpub
        self.ports = ports
        self.discovery = discovery
        self.peer_table = peer_table
        self.defaults = defaults
        self.changes = 0

    def wanted(self) -> list[str]:
        """The addresses meshd should use now."""
        s = self.settings
        if s.interfaces:
            present = present_addresses()
            return [a for a in s.interfaces if a in present]
        found = self.defaults()
        if s.insecure and not s.allow_insecure_lan:  # the start-up rule holds for late interfaces too
            found = [a for a in found if ipaddress.ip_address(a).is_loopback]
        return found

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.address_poll_interval)
            try:
                wanted = self.wanted()
                if wanted != self.interfaces:
                    await self.apply(wanted)
            except Exception:
                log.exception("following the interface addresses failed; trying again")

    async def apply(self, wanted: list[str]) -> None:
        """Move the daemon to ``wanted``: bind new, unbind gone, re-advertise, re-greet peers."""
        old = list(self.interfaces)
        added = [a for a in wanted if a not in old]
        gone = [a for a in old if a not in wanted]
        router_port, pub_port = self.ports()
        bound = []
        for addr in added:
            try:
                self.router.bind(f"tcp://{addr}:{router_port}")
                self.xpub.bind(f"tcp://{addr}:{pub_port}")
                bound.append(addr)
            except zmq.ZMQError as exc:
                log.error("cannot bind the new address %s (ports %d, %d): %s", addr, router_port,
                          pub_port, exc)
        for addr in gone:
            for sock, port in ((self.router, router_port), (self.xpub, pub_port)):
                with contextlib.suppress(zmq.ZMQError):
                    sock.unbind(f"tcp://{addr}:{port}")
        now = [a for a in wanted if a in old or a in bound]
        if now == old:
            return
        self.changes += 1
        self.interfaces[:] = now
        log.warning("interface addresses changed: %s -> %s (added %s, gone %s): re-bound, re-advertising "
                    "and greeting peers with the new endpoints", ", ".join(old) or "none",
                    ", ".join(now) or "none", ", ".join(bound) or "none", ", ".join(gone) or "none")
        discovery = self.discovery()
        if discovery is not None and now:
            await discovery.update_interfaces(now)
        self.peer_table.readdress([f"tcp://{a}:{router_port}" for a in now],
                                  [f"tcp://{a}:{pub_port}" for a in now])
