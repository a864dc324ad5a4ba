"""The peer table: other daemons of the mesh, how we reach them and whether they are alive.

Owns: :class:`Peer` records, discovered nodes whose key is not trusted yet, the HELLO exchange
(identity, gossip of other peers, the directory snapshot), peer control messages (heartbeat,
sync, dir, ack, bye) and liveness (online -> stale -> offline). Opening, watching and closing
each peer's sockets (static dials, ``ensure``, the DEALER monitor, redials with jittered
backoff) is :class:`~meshd.mesh.peer_dial.PeerDialer`, its base class. It must not touch the
directory, routing, agents or qos 1: what it learns it reports through :class:`PeerEvents`
callbacks, which node.py wires; peers and the directory never import each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import zmq

from meshd import transport
from meshd.discovery.mdns import PeerAdvert
from meshd.mesh.clones import CloneWatch
from meshd.mesh.keys import key_to_hex
from meshd.mesh.liveness import PeerState, next_state
from meshd.mesh.peer_dial import PeerDialer
from meshd.mesh.peer_record import Peer, PeerEvents
from meshd.mesh.security import Security
from meshd.mesh.sightings import Sightings
from meshd.mesh.two_way import EchoClock
from meshd.util.logonce import LogOnce
from meshd.util.shutdown import Shutdown
from meshd.wire import protocol as P
from meshd.wire.protocol import FrameError, Kind

if TYPE_CHECKING:  # meshd.config imports pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.config.settings import Settings

__all__ = ["Peer", "PeerEvents", "PeerState", "PeerTable"]  # Peer, PeerEvents: meshd/mesh/peer_record.py

log = logging.getLogger("meshd.node")


MAX_RIDS_PER_PEER = 4
"""Routing ids remembered per peer (each redial or restart of its DEALER brings a new one)."""


class PeerTable(PeerDialer):
    """Every peer this node knows, keyed by node id."""

    def __init__(self, settings: Settings, *, node_id: str, name: str, incarnation: str,
                 security: Security, events: PeerEvents, stats: Counter[str], quiet: LogOnce,
                 interfaces: list[str], max_frame: int, shutdown: Shutdown | None = None) -> None:
        self.settings = settings
        self.shutdown = shutdown if shutdown is not None else Shutdown()
        #: ZMTP heartbeats of every mesh socket: they follow heartbeat_interval and stale_after.
        self.zmtp_beats = transport.zmtp_heartbeat_for(settings.heartbeat_interval, settings.stale_after,
                                                       settings.offline_after)
        self.node_id = node_id
        self.name = name
        self.incarnation = incarnation
        self.security = security
        self.events = events
        self.stats = stats
        self.quiet = quiet
        self.interfaces = interfaces
        self.max_frame = max_frame
        self.peers: dict[str, Peer] = {}
        #: routing id -> the peer whose HELLO came from it (never the id's own claim, which anyone can make).
        self.by_rid: dict[bytes, Peer] = {}
        #: The boot id (HELLO ``incarnation``) and routers each routing id greeted us with: a
        #: heartbeat on a routing id of another boot id than its node's latest shows a clone.
        self.rid_boot: dict[bytes, tuple[str, list[str]]] = {}
        self.pending_static: dict[str, zmq.Socket[Any]] = {}
        self.untrusted_ads: dict[str, PeerAdvert] = {}
        self.static_keys: dict[str, str] = {}
        self.router_endpoints: list[str] = []
        self.pub_endpoints: list[str] = []
        self.started_at = time.monotonic()
        self._ctx: zmq.Context[Any] | None = None
        self._reactor: transport.Reactor | None = None
        self._beats = 0
        self.echo = EchoClock()
        bound = settings.discovered_records_max
        #: Node ids answered by two live daemons (cloned images), this one's included.
        self.clones = CloneWatch(node_id, incarnation, window=settings.offline_after * 3, max_nodes=bound)
        #: Nodes discovered that are not peers: untrusted key, other mesh, other protocol.
        self.sightings = Sightings(bound)

    @property
    def stopping(self) -> bool:
        return self.shutdown.begun

    def start(self, ctx: zmq.Context[Any], reactor: transport.Reactor, router_endpoints: list[str],
              pub_endpoints: list[str]) -> None:
        self._ctx, self._reactor = ctx, reactor
        self.router_endpoints, self.pub_endpoints = router_endpoints, pub_endpoints
        self.started_at = time.monotonic()

    @property
    def ctx(self) -> zmq.Context[Any]:
        if self._ctx is None:
            raise RuntimeError("the peer table is not started")
        return self._ctx

    @property
    def reactor(self) -> transport.Reactor:
        if self._reactor is None:
            raise RuntimeError("the peer table is not started")
        return self._reactor

    # ------------------------------------------------------------------ lookups

    def get(self, node_id: str | None) -> Peer | None:
        return self.peers.get(node_id) if node_id is not None else None

    def for_rid(self, rid: bytes) -> Peer | None:
        """The peer a mesh connection belongs to: the one that greeted us from that routing id."""
        return self.by_rid.get(rid)

    def claimed(self, rid: bytes) -> Peer | None:
        """The peer a routing id claims to be (its node-id part): only to ask it to greet us."""
        return self.peers.get(rid.partition(b".")[0].decode("ascii", "replace"))

    def _bind_rid(self, peer: Peer, rid: bytes) -> None:
        if rid in peer.rids:
            return
        peer.rids.append(rid)
        self.by_rid[rid] = peer
        while len(peer.rids) > MAX_RIDS_PER_PEER:
            gone = peer.rids.pop(0)
            self.by_rid.pop(gone, None)
            self.rid_boot.pop(gone, None)

    def _forget(self, peer: Peer) -> None:
        for rid in peer.rids:
            self.by_rid.pop(rid, None)
            self.rid_boot.pop(rid, None)
        del self.peers[peer.node_id]

    def __iter__(self) -> Iterator[Peer]:
        return iter(list(self.peers.values()))

    def __len__(self) -> int:
        return len(self.peers)

    def online_count(self) -> int:
        return sum(1 for p in self.peers.values() if p.state is PeerState.ONLINE)

    def online_ids(self) -> set[str]:
        """The node ids of the peers online now (discovery asks again while some are missing)."""
        return {p.node_id for p in self.peers.values() if p.state is PeerState.ONLINE}

    def by_state(self) -> dict[str, int]:
        counts = dict.fromkeys((str(s) for s in PeerState), 0)
        for p in self.peers.values():
            counts[str(p.state)] += 1
        return counts

    # ------------------------------------------------------------------ HELLO

    def hello_body(self, reply: bool, via: str | None = None) -> bytes:
        now = time.monotonic()
        gossip = [
            {"node": p.node_id, "routers": p.routers, "pubs": p.pubs, "pk": p.pubkey}
            for p in self.peers.values()
            if p.state is PeerState.ONLINE and p.routers
        ]
        return P.pack({
            "node": self.node_id,
            "name": self.name,
            "mesh": self.settings.mesh,
            "proto": P.PROTOCOL_VERSION,
            "incarnation": self.incarnation,
            "pk": self.security.public_key,
            "routers": self.router_endpoints,
            "pubs": self.pub_endpoints,
            "reply": reply,
            "via": via,  # the endpoint a static dial used; echoed back so the dial can be matched
            "uptime": round(now - self.started_at, 3),
            "peers": gossip,
            "dir": self.events.directory_body(),
            "dups": self.clones.wire(),
        })

    def send(self, peer: Peer, header: Mapping[str, Any], body: bytes = b"") -> bool:
        if peer.dealer is None:
            return False
        try:
            peer.dealer.send_multipart(P.frames(header, body), zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            self.stats["peer_send_failed"] += 1
            return False

    def send_hello(self, peer: Peer, reply: bool, via: str | None = None) -> None:
        self.send(peer, self._seq_header(Kind.HELLO, peer), self.hello_body(reply, via))

    def _seq_header(self, kind: str, peer: Peer | None) -> dict[str, Any]:
        return self.echo.header(kind, self.node_id, peer, time.monotonic())

    def two_way(self, peer: Peer, now: float) -> bool:
        """Whether the peer confirmed hearing us recently (a peer that sends no SEQ: always)."""
        return self.echo.two_way(peer, now, self.settings.stale_after + self.settings.heartbeat_interval)

    def _heard_state(self, peer: Peer, now: float) -> PeerState:
        return PeerState.ONLINE if self.two_way(peer, now) else PeerState.ONE_WAY

    # ------------------------------------------------------------------ discovery and dials

    def on_discovered(self, ad: PeerAdvert) -> None:
        if self.stopping or ad.node_id == self.node_id:
            return
        pubkey = self.security.server_key(ad.pubkey)
        trusted = self.security.curve is None or pubkey is not None
        refused = self.sightings.refusal(ad, self.settings.mesh, trusted, self.quiet,
                                         secure=self.security.curve is not None)
        if refused == "untrusted":
            self.untrusted_ads[ad.node_id] = ad  # dialed if its key is trusted later
            while len(self.untrusted_ads) > self.settings.discovered_records_max:
                del self.untrusted_ads[next(iter(self.untrusted_ads))]
            self.stats["untrusted_adverts"] += 1
        if refused is not None:
            return
        router = ad.router_endpoint(self.interfaces)
        pub = ad.pub_endpoint(self.interfaces)
        peer = self.peers.get(ad.node_id)
        self.stats["discovered"] += 1
        if peer is not None and peer.dealer is not None and peer.connected_router == router:
            if peer.state is not PeerState.ONLINE:
                self.send_hello(peer, reply=False)  # it may have restarted: greet again
            return
        peer = self.ensure(ad.node_id, [router], [pub], source="mdns", pubkey=pubkey)
        peer.name = peer.name or ad.name
        self.send_hello(peer, reply=False)

    def on_discovery_lost(self, node_id: str) -> None:
        peer = self.peers.get(node_id)
        if peer is not None and peer.state is not PeerState.OFFLINE:
            log.info("peer %s (%s) said goodbye on mDNS", node_id, peer.name)
            self.set_state(peer, PeerState.OFFLINE)

    def set_state(self, peer: Peer, state: PeerState) -> None:
        if peer.state is state:
            return
        old, peer.state = peer.state, state
        log.info("peer %s (%s): %s -> %s", peer.node_id, peer.name, old, state)
        self.stats[f"peer_{state}"] += 1
        if state is PeerState.OFFLINE:
            peer.dir_version = -1
            peer.greeted = False
        self.events.state_changed(peer, old, state)

    # ------------------------------------------------------------------ control messages

    def unknown_sender(self, peer: Peer | None) -> None:
        """Traffic before HELLO is dropped; if we can reach the sender, ask it to greet us."""
        self.stats["dropped_before_hello"] += 1
        now = time.monotonic()
        if self.stopping:
            return
        if peer is not None and peer.dealer is not None and now - peer.last_sync_request > 1.0:
            peer.last_sync_request = now
            self.send_hello(peer, reply=False)

    def heard_from(self, peer: Peer) -> None:
        """Any traffic from a greeted peer is a heartbeat (online once it confirms hearing us)."""
        peer.last_seen = time.monotonic()
        if peer.state is not PeerState.ONLINE:
            self.set_state(peer, self._heard_state(peer, peer.last_seen))

    def on_control(self, rid: bytes, peer: Peer | None, header: P.Header, frames: list[bytes],
                   key: str = "") -> None:
        """HELLO, heartbeat, sync, dir, ack and bye from a peer. ``key``: in keys mode, the ZAP
        User-Id (the authenticated key) the message arrived with, which a HELLO must claim."""
        kind = header.kind
        now = time.monotonic()
        if kind == Kind.HELLO:
            try:
                body = P.unpack_body(frames[3])
                self._on_hello(rid, header, body, key)
            except (FrameError, KeyError, TypeError, ValueError) as exc:
                self.events.reject(FrameError("bad_hello", str(exc)), frames, f"peer {rid[:32]!r}")
            return
        if peer is None or not peer.greeted:
            self.unknown_sender(peer or self.claimed(rid))
            return
        peer.last_seen = now
        if kind == Kind.HEARTBEAT:
            self.echo.took(peer, header, now)
            self._check_clone(peer, rid, now)
        if kind != Kind.BYE and peer.state is not PeerState.ONLINE:
            self.set_state(peer, self._heard_state(peer, now))
        if kind == Kind.HEARTBEAT:
            if len(frames) > 3 and frames[3]:
                with contextlib.suppress(FrameError):
                    body = P.unpack_body(frames[3], 256 * 1024)
                    if isinstance(body, dict):
                        peer.telemetry = body
            version = header.get(P.VER)
            if version != peer.dir_version and now - peer.last_sync_request > 0.5:
                peer.last_sync_request = now
                self.send(peer, {P.KIND: Kind.SYNC, P.FROM: self.node_id})
        elif kind == Kind.SYNC:
            self.send(peer, {P.KIND: Kind.DIRECTORY, P.FROM: self.node_id,
                             P.VER: self.events.directory_version()}, P.pack(self.events.directory_body()))
        elif kind == Kind.DIRECTORY:
            try:
                self.events.directory(peer, P.unpack_body(frames[3]))
            except FrameError as exc:
                self.events.reject(exc, frames, f"peer {peer.node_id}")
        elif kind == Kind.ACK:
            ids = header.get(P.IDS)
            if isinstance(ids, list):
                self.events.acks([i for i in ids if isinstance(i, str)])
        elif kind == Kind.NACK:
            ids, err = header.get(P.IDS), header.get(P.ERROR)
            if isinstance(ids, list) and isinstance(err, dict):
                self.events.nacks([i for i in ids if isinstance(i, str)][:P.ACK_IDS], err)
        elif kind == Kind.BYE:
            log.info("peer %s (%s) left", peer.node_id, peer.name)
            self.set_state(peer, PeerState.OFFLINE)

    def _on_hello(self, rid: bytes, header: P.Header, body: Any, key: str) -> None:
        if self.stopping:
            return  # we said BYE: greeting back now would make the peer re-admit a leaving node
        if not isinstance(body, dict):
            raise ValueError("HELLO body is not a map")
        node_id = str(body["node"])
        if rid.decode("ascii", "replace").partition(".")[0] != node_id:
            raise ValueError(f"routing id {rid[:40]!r} does not start with node id {node_id!r}")
        if node_id == self.node_id:
            if body.get("incarnation") != self.incarnation:  # a daemon with our id greets us
                self.clones.cloned([{"inc": body.get("incarnation"), "routers": body.get("routers", [])}],
                                   "it greeted this node")
            return
        if body.get("mesh") != self.settings.mesh:
            self.quiet.log(f"mesh:{node_id}", "ignoring node %s of mesh %r", node_id, body.get("mesh"))
            self.stats["other_mesh"] += 1
            return
        if body.get("proto") != P.PROTOCOL_VERSION:
            self.quiet.log(f"proto:{node_id}", "not greeting node %s: it speaks protocol %r, this node "
                           "speaks %s only", node_id, body.get("proto"), P.PROTOCOL_VERSION,
                           level=logging.WARNING)
            return
        routers = [str(r) for r in body.get("routers", [])]
        pubs = [str(p) for p in body.get("pubs", [])]
        existing = self.peers.get(node_id)
        pubkey: str | None = None
        if self.security.curve is not None:
            claimed = body.get("pk")
            if self.security.check_uid and claimed != key:
                raise ValueError(f"HELLO from {node_id} claims key {claimed!r} but authenticated "
                                 f"as {key!r}")
            pubkey = self.security.server_key(claimed)
            if pubkey is None:
                raise ValueError(f"HELLO from {node_id} with untrusted key {claimed!r}")
            if (self.security.check_uid and existing is not None and existing.pubkey
                    and existing.pubkey != pubkey and existing.state is not PeerState.OFFLINE):
                # Another trusted node claims a live peer's node id: refuse it, keep the real one
                # (its key can change only once it has gone offline).
                self.stats["dropped_spoofed_hello"] += 1
                self.quiet.log(f"spoofhello:{node_id}:{pubkey}", "refused a HELLO claiming to be node "
                               "%s from key %s (its key is %s)", node_id, pubkey, existing.pubkey)
                return
        via = body.get("via")
        dialed = isinstance(via, str) and via in self.pending_static
        source = existing.source if existing else ("static" if dialed or any(
            r in self.pending_static for r in routers) else "gossip")
        peer = self.ensure(node_id, routers, pubs, source=source, pubkey=pubkey)
        if peer.redial_pending:  # it refused our key, but it dials only keys it trusts: dial it now
            peer.redial_attempts = 0
            self._redial(peer)
        if dialed and isinstance(via, str) and via in self.pending_static:
            # We dialed it by an address it does not advertise (a host name, NAT): the answer
            # matched the dial; its advertised endpoint is used from now on.
            self.pending_static.pop(via).close(0)
        incarnation = str(body.get("incarnation", ""))
        now = time.monotonic()
        if self.clones.saw(node_id, incarnation, routers, now):
            self.stats["duplicate_node_ids"] += 1
            self.send_hello(peer, reply=True)  # carries `dups`
            self._tell_clones(peer)
        if peer.incarnation and peer.incarnation != incarnation and not self.clones.is_duplicate(node_id):
            log.info("peer %s restarted", node_id)
            self.events.restarted(peer)
        if peer.incarnation != incarnation:
            peer.incarnation_at = now
        peer.incarnation = incarnation
        peer.name = str(body.get("name", ""))
        self._bind_rid(peer, rid)
        self.rid_boot[rid] = (incarnation, routers)
        peer.greeted = True
        peer.last_seen = now
        self.echo.took(peer, header, now)
        self.set_state(peer, self._heard_state(peer, now))
        self.events.directory(peer, body.get("dir"))
        if not body.get("reply"):
            self.send_hello(peer, reply=True, via=via if isinstance(via, str) else None)
        else:
            self.beat_one(peer)  # echo its SEQ now: it sees us online without waiting a beat
        self.stats["duplicate_node_ids"] += self.clones.take_report(body.get("dups"), now)
        for entry in body.get("peers", []):
            if not isinstance(entry, dict):
                continue
            other = str(entry.get("node", ""))
            if other and other != self.node_id and other not in self.peers:
                gossip_key = self.security.server_key(entry.get("pk"))
                if self.security.curve is not None and gossip_key is None:
                    continue  # we do not trust that node: nothing out
                gossiped = self.ensure(other, [str(r) for r in entry.get("routers", [])],
                                       [str(p) for p in entry.get("pubs", [])], source="gossip",
                                       pubkey=gossip_key)
                self.send_hello(gossiped, reply=False)

    def _tell_clones(self, peer: Peer) -> None:
        """Greet every other daemon answering as ``peer``'s node id once, with ``dups``: our DEALER
        reaches only one of them, and each clone must log that it is one. A short-lived DEALER per
        router (at most 4), pinned to the node's key (clones share it), closed after a few seconds."""
        hello = P.frames(self._seq_header(Kind.HELLO, None), self.hello_body(reply=True))
        routers = [r for d in self.clones.describe(peer.node_id) for r in d["routers"]
                   if r != peer.connected_router][:4]
        for router in dict.fromkeys(routers):
            try:
                dealer = transport.peer_dealer(self.ctx, self.node_id, self.security.curve, peer.pubkey,
                                               self.zmtp_beats)
                dealer.connect(router)
                dealer.send_multipart(hello, zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                self.quiet.log(f"tellclone:{router}", "could not tell %s of its duplicate id: %s",
                               router, exc)
                continue
            asyncio.get_running_loop().call_later(3.0, dealer.close, transport.LINGER_MS)

    def _check_clone(self, peer: Peer, rid: bytes, now: float) -> None:
        """A heartbeat from a routing id that greeted with an older boot id than the node's latest
        HELLO, well after that HELLO: two live daemons share this node id (a cloned image). Each
        clone's DEALER has its own routing id, so both keep beating. A restart's old connection
        goes quiet at once, and two heartbeat intervals leave its last beats time to drain."""
        boot = self.rid_boot.get(rid)
        if boot is None or boot[0] == peer.incarnation:
            return
        if now - peer.incarnation_at < 2 * self.settings.heartbeat_interval:
            return
        # The older boot id is alive now; the latest one greeted recently or beats too: seeing
        # both, in turn, is what reveals the duplicate (a sighting from long ago would not count).
        found = self.clones.saw(peer.node_id, boot[0], boot[1], now)
        current = next((b[1] for b in self.rid_boot.values() if b[0] == peer.incarnation), [])
        if self.clones.saw(peer.node_id, peer.incarnation, current, now) or found:
            self.stats["duplicate_node_ids"] += 1
            self.send_hello(peer, reply=True)  # carries `dups`
            self._tell_clones(peer)

    # ------------------------------------------------------------------ timers' work

    def beat(self) -> None:
        """One heartbeat to every peer (with the local agents' telemetry); re-greet static dials
        that have not answered, and every tenth beat dial them afresh."""
        # The beat carries the local agents' latest telemetry (small: a few numbers each),
        # so every node sees load and state mesh-wide without versioning the directory.
        body = P.pack(self.events.telemetry())
        self.stats["hb_body_bytes"] = len(body)  # a gauge: the last round's (contracts never ride here)
        seq = self.echo.next(time.monotonic())  # one SEQ per round; each peer gets its own ECHO
        for peer in list(self.peers.values()):
            self.beat_one(peer, body, seq)
        self._beats += 1
        for endpoint, dealer in list(self.pending_static.items()):
            if self._beats % 10 == 0:
                # No answer for a while (down, or it refused our key): dial afresh.
                dealer.close(0)
                del self.pending_static[endpoint]
                self.dial_static(endpoint + (f"?key={key_to_hex(self.static_keys[endpoint])}"
                                             if endpoint in self.static_keys else ""))
                continue
            # A static peer that has not answered yet: greet it again (it may be starting).
            with contextlib.suppress(zmq.ZMQError):
                dealer.send_multipart(P.frames(self._seq_header(Kind.HELLO, None),
                                               self.hello_body(reply=False, via=endpoint)), zmq.NOBLOCK)

    def beat_one(self, peer: Peer, body: bytes | None = None, seq: int | None = None) -> None:
        """A heartbeat to one peer, echoing the last SEQ it sent us."""
        if peer.dealer is None:
            return
        header = self.echo.header(Kind.HEARTBEAT, self.node_id, peer, time.monotonic(), seq,
                                  **{P.VER: self.events.directory_version()})
        payload = body if body is not None else P.pack(self.events.telemetry())
        try:
            peer.dealer.send_multipart(P.frames(header, payload), zmq.NOBLOCK)
        except zmq.Again:
            peer.congested_at = time.monotonic()  # queued to the brim: congested, not one-way
        except zmq.ZMQError:
            pass

    def check_liveness(self, now: float) -> None:
        """Move silent peers along online -> stale -> offline (``now``: monotonic seconds)."""
        s = self.settings
        self.clones.prune(now)
        for peer in list(self.peers.values()):
            if not peer.greeted and peer.state is PeerState.OFFLINE:
                continue
            state = next_state(peer.state, now - peer.last_seen, s.stale_after, s.offline_after)
            if state is None and peer.state is PeerState.ONLINE and not self.two_way(peer, now):
                state = PeerState.ONE_WAY
                self.quiet.log(f"oneway:{peer.node_id}:{peer.incarnation}",
                               "peer %s (%s): ONE-WAY LINK: we hear it, but it has not confirmed hearing "
                               "us for %.1f s; traffic to it fails with PEER_UNREACHABLE until it does",
                               peer.node_id, peer.name, now - peer.confirmed_at, level=logging.WARNING)
            if state is not None:
                self.set_state(peer, state)

    def apply_trust_change(self) -> None:
        """Cut off peers whose key is no longer trusted; dial discovered ones that now are."""
        for peer in list(self.peers.values()):
            if peer.pubkey and not self.security.is_trusted(peer.pubkey):
                log.warning("peer %s (%s) is no longer trusted: disconnected", peer.node_id, peer.name)
                self.set_state(peer, PeerState.OFFLINE)
                self.close_dealer(peer)
                self.close_sub(peer)
                self._forget(peer)
        for node_id, ad in list(self.untrusted_ads.items()):
            if self.security.server_key(ad.pubkey) is not None:
                del self.untrusted_ads[node_id]
                self.on_discovered(ad)

    # ------------------------------------------------------------------ shutdown

    def say_bye(self) -> None:
        for peer in self.peers.values():
            if peer.dealer is not None and peer.state is not PeerState.OFFLINE:
                self.send(peer, {P.KIND: Kind.BYE, P.FROM: self.node_id})

    def close(self) -> None:
        """Close every peer socket (bounded linger) and pending static dial."""
        for peer in self.peers.values():
            for sock in (peer.dealer, peer.sub, peer.monitor):
                if sock is not None:
                    sock.close(transport.LINGER_MS)
        for sock in self.pending_static.values():
            sock.close(0)
