"""The other sites' agents as this site's bridge knows them, and the names they get here.

Pure (the clock is passed in). Each site announces its agents every few seconds; a site not heard
from for ``hold`` seconds is forgotten. Bounded: at most ``max_sites`` sites and ``max_agents``
agents in all; what does not fit is counted, never kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshd.bindings.nats.subjects import qualified

__all__ = ["ProxyName", "RemoteDirectory"]


@dataclass(frozen=True, slots=True)
class ProxyName:
    """A name this site's directory shows for ``name`` of ``site`` (``alias``: the plain one)."""

    site: str
    name: str
    alias: bool


@dataclass(slots=True)
class _Site:
    agents: dict[str, dict[str, Any]]
    heard: float


@dataclass
class RemoteDirectory:
    own_site: str
    hold: float = 10.0
    max_sites: int = 64
    max_agents: int = 1024
    sites: dict[str, _Site] = field(default_factory=dict)
    refused_sites: int = 0
    refused_agents: int = 0

    def apply(self, site: str, agents: list[dict[str, Any]], now: float) -> bool:
        """One announcement of ``site``; False if it was not kept (own site, or past the bounds)."""
        if site == self.own_site:
            return False
        if site not in self.sites and len(self.sites) >= self.max_sites:
            self.refused_sites += 1
            return False
        others = sum(len(s.agents) for n, s in self.sites.items() if n != site)
        room = max(0, self.max_agents - others)
        if len(agents) > room:
            self.refused_agents += len(agents) - room
        self.sites[site] = _Site({a["name"]: a for a in agents[:room]}, now)
        return True

    def expire(self, now: float) -> list[str]:
        """Forget the sites not heard from within ``hold``; returns them."""
        gone = [n for n, s in self.sites.items() if now - s.heard > self.hold]
        for n in gone:
            del self.sites[n]
        return gone

    def record(self, site: str, name: str) -> dict[str, Any] | None:
        s = self.sites.get(site)
        return None if s is None else s.agents.get(name)

    def names(self, local: set[str]) -> dict[str, ProxyName]:
        """Every name this site shows for remote agents: ``name:site`` always, and the plain
        ``name`` when no local agent has it and only one other site does."""
        out: dict[str, ProxyName] = {}
        sites_of: dict[str, list[str]] = {}
        for site, s in self.sites.items():
            for name in s.agents:
                out[qualified(name, site)] = ProxyName(site, name, False)
                sites_of.setdefault(name, []).append(site)
        for name, where in sites_of.items():
            if len(where) == 1 and name not in local and name not in out:
                out[name] = ProxyName(where[0], name, True)
        return out

    def topics(self) -> set[str]:
        """The topics other sites' agents subscribe to (what this site's publications must reach)."""
        return {t for s in self.sites.values() for a in s.agents.values() for t in a.get("topics", ())}
