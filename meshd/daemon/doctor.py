"""``meshd doctor`` / ``meshctl doctor``: why a node does not see another, from facts.

Owns: turning what the daemon knows (its interfaces, the peer table, the nodes discovered but
not peers, duplicate ids, its ports) into a report: ``facts`` and ``problems`` (each with a
``code``, a ``message`` and a ``hint``). :func:`interface_facts` reads this host's interfaces
(flags from /sys/class/net); :func:`daemon_report` reads a running node's parts. It must not
change anything: it only reads and explains.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ifaddr

from meshd.mesh.liveness import PeerState
from meshd.wire import protocol as P

if TYPE_CHECKING:
    from meshd.config.settings import Settings
    from meshd.discovery.mdns import PeerAdvert
    from meshd.mesh.peers import PeerTable

__all__ = ["daemon_report", "interface_facts", "local_report", "mdns_findings"]

_IFF_UP = 0x1
_IFF_LOOPBACK = 0x8
_IFF_MULTICAST = 0x1000


def _flags(ifname: str) -> int | None:
    try:
        return int(Path(f"/sys/class/net/{ifname}/flags").read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def interface_facts(addresses: list[str]) -> list[dict[str, Any]]:
    """For each IPv4 address meshd uses: its interface, whether it is up and multicast-capable."""
    by_ip: dict[str, str] = {}
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                by_ip.setdefault(ip.ip, adapter.name)
    out = []
    for addr in addresses:
        ifname = by_ip.get(addr)
        flags = _flags(ifname) if ifname else None
        out.append({
            "address": addr, "interface": ifname, "present": ifname is not None,
            "up": bool(flags is not None and flags & _IFF_UP),
            "multicast": bool(flags is not None and flags & _IFF_MULTICAST),
            "loopback": bool(flags is not None and flags & _IFF_LOOPBACK),
        })
    return out


def _problem(code: str, message: str, hint: str) -> dict[str, str]:
    return {"code": code, "message": message, "hint": hint}


def local_report(settings: Settings, interfaces: list[str]) -> dict[str, Any]:
    """What can be checked without a running daemon: interfaces, multicast, discovery setting."""
    problems: list[dict[str, str]] = []
    facts = interface_facts(interfaces)
    if not interfaces:
        problems.append(_problem("no_interface", "no usable network interface was found",
                                 "pass --interface IP, or bring an interface up"))
    for f in facts:
        if not f["present"]:
            problems.append(_problem("address_gone", f"address {f['address']} is on no interface",
                                     "the address changed (DHCP?): meshd follows it unless it was "
                                     "configured with --interface"))
        elif settings.discovery and not f["multicast"] and not f["loopback"]:
            problems.append(_problem("no_multicast", f"interface {f['interface']} ({f['address']}) has "
                                     "no MULTICAST flag: mDNS discovery cannot work on it",
                                     f"`ip link set {f['interface']} multicast on`, or list peers "
                                     "statically (peers = [...])"))
    if not settings.discovery and not settings.peers:
        problems.append(_problem("nothing_to_find", "discovery is off and no static peer is configured",
                                 "turn discovery on or add peers = [\"tcp://HOST:PORT\"]"))
    return {"facts": {"interfaces": facts, "mesh": settings.mesh, "discovery": settings.discovery,
                      "protocol": P.PROTOCOL_VERSION, "accepts_protocols": [P.PROTOCOL_VERSION]},
            "problems": problems}


def daemon_report(settings: Settings, interfaces: list[str], peers: PeerTable,
                  ports: dict[str, int], heard: list[PeerAdvert] | None = None) -> dict[str, Any]:
    """The local report plus what the running daemon has seen: peers, sightings, duplicates, and
    the nodes discovery ``heard`` of that are no peer online."""
    report = local_report(settings, interfaces)
    problems: list[dict[str, str]] = report["problems"]
    now = time.monotonic()
    refused = {row["node"] for row in peers.sightings.rows(now)}
    for ad in heard or ():
        peer = peers.peers.get(ad.node_id)
        if ad.node_id in refused or (peer is not None and peer.state is not PeerState.OFFLINE):
            continue  # refused (a sighting, below) or a peer with a state of its own (below)
        problems.append(_problem("discovered_not_connected", f"node {ad.node_id} ({ad.name}) answers on "
                                 f"mDNS at {', '.join(ad.addresses)} but is no peer of this node",
                                 f"can this host reach TCP {ad.router_endpoint()}? (firewall, route, "
                                 "its daemon stopped since it advertised)"))

    rows = []
    for peer in peers:
        rows.append({"node": peer.node_id, "name": peer.name, "state": str(peer.state),
                     "router": peer.connected_router, "source": peer.source,
                     "heard_ago": round(now - peer.last_seen, 3) if peer.last_seen else None,
                     "confirmed_ago": round(now - peer.confirmed_at, 3) if peer.confirmed_at else None})
        if peer.state is PeerState.ONE_WAY:
            problems.append(_problem("one_way", f"node {peer.node_id} ({peer.name}): we hear it, but it "
                                     "does not confirm hearing us", f"a firewall or route drops traffic "
                                     f"to {peer.connected_router}; check it from that host"))
        elif peer.state is not PeerState.ONLINE and peer.routers:
            problems.append(_problem("unreachable", f"node {peer.node_id} ({peer.name}) is {peer.state} "
                                     f"at its advertised address {peer.connected_router or peer.routers[0]}",
                                     "is it running? does a firewall allow that TCP port?"))
    for row in peers.sightings.rows(now):
        if row["state"] == "untrusted":
            hint = (f"compare {row['fingerprint']} with `meshctl keys show` on that host, then "
                    f"`meshctl keys trust {row['trust_name']}`")
        elif row["state"] == "other-security":
            hint = ("run every node of a mesh in one mode: CurveZMQ (trusted keys or a mesh secret), or "
                    "--insecure with allow_insecure_lan on a private lab LAN")
        elif row["state"] == "other-mesh":
            hint = f"set mesh = {settings.mesh!r} on it (or join its mesh) if it should be in this one"
        else:
            hint = "run the same meshd version on every node (protocol versions must match)"
        problems.append(_problem(row["state"].replace("-", "_"), f"node {row['node']} ({row['name']}) at "
                                 f"{', '.join(row['addresses'])}: {row['detail']}", hint))
    for node_id in list(peers.clones.found):
        where = "; ".join(f"{', '.join(d['routers']) or '?'}" for d in peers.clones.describe(node_id))
        problems.append(_problem("duplicate_id", f"node id {node_id} is used by two machines ({where})",
                                 "on one of them: `meshd reset-identity` (then restart it)"))
    if peers.clones.self_duplicate:
        problems.append(_problem("duplicate_id", f"this node's id {peers.node_id} is used by another "
                                 "machine too", "`meshd reset-identity` here or there, then restart"))
    report["facts"].update({
        "node": peers.node_id, "peers": rows, "discovered_not_peers": peers.sightings.rows(now),
        "peers_online": peers.online_count(),
        "heard_on_mdns": [{"node": ad.node_id, "name": ad.name, "addresses": list(ad.addresses)}
                          for ad in heard or ()],
        "ports": ports,
        "firewall": f"allow TCP {ports.get('router')} and {ports.get('pub')} and UDP 5353 (mDNS) "
                    "on the interfaces above",
    })
    return report


def mdns_findings(report: dict[str, Any], traffic: list[dict[str, Any]], seconds: float) -> None:
    """Add what a passive listen saw (meshd/discovery/mdns_watch.py) to ``report``: per-interface counts as
    ``facts.mdns``, and ``no_mdns`` for a chosen interface that saw no mDNS at all while this
    node's daemon sent a query on it or while peers are expected."""
    facts = report["facts"]
    queried = bool(facts.get("mdns_query_sent"))
    expected = bool(facts.get("peers") or facts.get("discovered_not_peers"))
    facts["mdns"] = {"listened_s": seconds, "daemon_queried": queried, "interfaces": traffic}
    answers = sum(int(t.get("meshd_answers") or 0) for t in traffic)
    if facts.get("peers_online") == 0 and answers:
        names = sorted({n for t in traffic for n in t.get("meshd_names") or ()})
        report["problems"].append(_problem(
            "alone_but_answered", f"this node has no peer online, yet {answers} meshd answer(s) were "
            f"heard in {seconds:g} s ({', '.join(names[:6]) or 'names not kept'})",
            "if those are nodes of this mesh, their answers reach this host but this daemon did not "
            "connect: see discovered_not_connected above, the node's log (no peer for ...), and "
            "whether they run another mesh name or security mode"))
    for t in traffic:
        where = f"{t['interface']} ({t['address']})"
        if t["error"] and t["joined"] is False and not t["error"].startswith("counted with"):
            report["problems"].append(_problem("no_mdns", f"no multicast on {t['interface']}: {t['error']}",
                                               "is the interface up with the MULTICAST flag?"))
        elif t["joined"] and t["packets"] == 0 and (queried or expected):
            why = ("although this node's daemon sent an mDNS query on it" if queried
                   else "although peers are expected")
            report["problems"].append(_problem(
                "no_mdns", f"no multicast on {t['interface']}: no mDNS packet seen on {where} in "
                f"{seconds:g} s, {why}", "a firewall dropping UDP 5353 or 224.0.0.251, the MULTICAST "
                f"flag off (`ip link show {t['interface']}`), or a switch filtering multicast; or "
                "list peers statically (peers = [...])"))
