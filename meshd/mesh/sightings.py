"""Nodes discovered on mDNS that are not peers, and why: untrusted key, other mesh, other protocol.

``meshctl peers --all`` and ``meshctl doctor`` list them so that nothing discovered is ignored
silently. Each row keeps the node's advert (id, name, addresses, key) and the reason it is not a
peer; a node that becomes a peer is forgotten here.

Owns: that table, bounded (``discovered_records_max``; the oldest row is forgotten first and
counted in ``forgotten``), and the warning logged once per refused node (with the fix: for an
untrusted key, its fingerprint and the exact ``meshctl keys trust NAME`` command). It must not
dial or judge trust: peers.py says whether the key is trusted and dials what is not refused.
"""

from __future__ import annotations

import logging
import re
import time
from collections import OrderedDict
from typing import Any

from meshd.discovery.mdns import PeerAdvert
from meshd.mesh.keys import fingerprint
from meshd.util.logonce import LogOnce
from meshd.wire import protocol as P

__all__ = ["Sightings"]

_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Sightings:
    """Discovered nodes that are not peers, newest last."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._rows: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self.forgotten = 0

    @staticmethod
    def trust_name(ad: PeerAdvert) -> str:
        """The NAME for ``meshctl keys trust NAME``: the node's name if it makes a key file name."""
        return ad.name if _KEY_NAME.match(ad.name) else ad.node_id

    def record(self, ad: PeerAdvert, reason: str, detail: str) -> None:
        """Remember that ``ad`` is not a peer because of ``reason`` (one row per node and mesh)."""
        key = (ad.node_id, ad.mesh)
        self._rows[key] = {
            "node": ad.node_id, "name": ad.name, "state": reason, "detail": detail, "mesh": ad.mesh,
            "proto": ad.proto, "addresses": list(ad.addresses),
            "router": ad.router_endpoint(), "key": ad.pubkey,
            "fingerprint": fingerprint(ad.pubkey) if ad.pubkey else None,
            "trust_name": self.trust_name(ad), "seen_at": time.monotonic(),
        }
        self._rows.move_to_end(key)
        while len(self._rows) > self.capacity:
            self._rows.popitem(last=False)
            self.forgotten += 1

    def refusal(self, ad: PeerAdvert, mesh: str, key_trusted: bool, quiet: LogOnce,
                secure: bool = True) -> str | None:
        """Why ``ad`` must not be dialed (``other-mesh``, ``other-protocol``, ``other-security``,
        ``untrusted``), recorded and logged once; None (and the node forgotten here) when it may
        be dialed. ``secure``: this node runs CurveZMQ (a node advertises a key only when it does)."""
        if ad.mesh != mesh:
            self.record(ad, "other-mesh", f"mesh {ad.mesh!r}, not {mesh!r}")
            return "other-mesh"
        if ad.proto != P.PROTOCOL_VERSION:
            self.record(ad, "other-protocol", f"speaks protocol {ad.proto}; this node speaks "
                        f"{P.PROTOCOL_VERSION} only (docs/PROTOCOL.md §12)")
            quiet.log(f"proto:{ad.node_id}", "not dialing node %s (%s): it speaks protocol %s, this node "
                      "speaks %s only; upgrade the older one", ad.node_id, ad.name, ad.proto,
                      P.PROTOCOL_VERSION, level=logging.WARNING)
            return "other-protocol"
        if secure != (ad.pubkey is not None):
            theirs, ours = ("CurveZMQ", "plaintext (--insecure)") if ad.pubkey else (
                "plaintext (--insecure)", "CurveZMQ")
            self.record(ad, "other-security", f"it runs {theirs}; this node runs {ours}: they cannot talk")
            quiet.log(f"security:{ad.node_id}", "not dialing node %s (%s) of this mesh: it runs %s and this "
                      "node runs %s, so neither can talk to the other. Run every node of a mesh in the same "
                      "mode", ad.node_id, ad.name, theirs, ours, level=logging.WARNING)
            return "other-security"
        if not key_trusted:
            print_ = fingerprint(ad.pubkey) if ad.pubkey else "none (it advertises no key)"
            self.record(ad, "untrusted", f"key fingerprint {print_}")
            quiet.log(f"untrusted:{ad.node_id}:{ad.pubkey}",
                      "not dialing discovered node %s (%s): its key is not trusted (fingerprint %s). "
                      "Compare it with `meshctl keys show` on that host, then run: meshctl keys trust %s",
                      ad.node_id, ad.name, print_, self.trust_name(ad), level=logging.WARNING)
            return "untrusted"
        self.forget(ad.node_id)
        return None

    def forget(self, node_id: str) -> None:
        for key in [k for k in self._rows if k[0] == node_id]:
            del self._rows[key]

    def rows(self, now: float | None = None) -> list[dict[str, Any]]:
        """Every row, with ``seen_ago`` (seconds) instead of the monotonic time."""
        now = time.monotonic() if now is None else now
        out = []
        for row in self._rows.values():
            entry = {k: v for k, v in row.items() if k != "seen_at"}
            entry["seen_ago"] = round(now - row["seen_at"], 3)
            out.append(entry)
        return out

    def find(self, name: str) -> list[dict[str, Any]]:
        """Rows whose node id, name or trust name is ``name``."""
        return [r for r in self.rows() if name in (r["node"], r["name"], r["trust_name"])]
