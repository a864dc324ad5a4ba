"""Dialing peers: the DEALER and SUB each peer gets, the DEALER's monitor, and redials.

Owns: :class:`PeerDialer`, the part of :class:`~meshd.mesh.peers.PeerTable` that opens, watches and
closes peer sockets: static dials waiting for their HELLO reply, ``ensure`` (create or re-dial a
peer when its endpoints or key change), the plaintext-outside-loopback refusal, the monitor
events (dropped connection, handshake done, key refused) and redials with jittered backoff,
re-dialing everyone when our addresses change (``readdress``), and topic (un)subscriptions on
every peer's SUB. It must not decide liveness or build HELLOs (peers.py does, through
``set_state``, ``send_hello``, ``hello_body``) and must not touch the directory, routing,
agents or qos 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from meshd import transport
from meshd.mesh.keys import key_from_hex
from meshd.mesh.liveness import PeerState
from meshd.mesh.peer_record import Peer, PeerEvents
from meshd.mesh.security import Security
from meshd.util.backoff import backoff_delay
from meshd.util.logonce import LogOnce
from meshd.wire import protocol as P
from meshd.wire.protocol import Kind

__all__ = ["PeerDialer", "prefer_endpoint"]

log = logging.getLogger("meshd.node")


def prefer_endpoint(endpoints: list[str], own: list[str]) -> str:
    """Pick the endpoint whose address shares a /24 with one of ours; else the first."""
    for ep in endpoints:
        host = ep.removeprefix("tcp://").rsplit(":", 1)[0]
        for mine in own:
            if host.rsplit(".", 1)[0] == mine.rsplit(".", 1)[0]:
                return ep
    return endpoints[0]


class PeerDialer:
    """Peer sockets for :class:`~meshd.mesh.peers.PeerTable` (a base class: the table's state is its own)."""

    node_id: str
    security: Security
    events: PeerEvents
    stats: Counter[str]
    quiet: LogOnce
    interfaces: list[str]
    max_frame: int
    peers: dict[str, Peer]
    pending_static: dict[str, zmq.Socket[Any]]
    static_keys: dict[str, str]
    router_endpoints: list[str]
    zmtp_beats: transport.ZmtpBeats
    pub_endpoints: list[str]

    if TYPE_CHECKING:  # defined by PeerTable
        @property
        def stopping(self) -> bool: ...
        @property
        def ctx(self) -> zmq.Context[Any]: ...
        @property
        def reactor(self) -> transport.Reactor: ...
        def hello_body(self, reply: bool, via: str | None = None) -> bytes: ...
        def send_hello(self, peer: Peer, reply: bool, via: str | None = None) -> None: ...
        def set_state(self, peer: Peer, state: PeerState) -> None: ...
        def _seq_header(self, kind: str, peer: Peer | None) -> dict[str, Any]: ...

    def dial_static(self, endpoint: str) -> None:
        """Connect to a configured peer whose node id we learn from its HELLO reply."""
        endpoint, _, query = endpoint.partition("?")
        if endpoint in self.router_endpoints or endpoint in self.pending_static:
            return
        if self._plaintext_refused(endpoint):
            return
        key = key_from_hex(query.removeprefix("key=")) if query else None
        server_key = self.security.static_server_key(key)
        if self.security.curve is not None and server_key is None:
            log.error("static peer %s has no key: in trust_mode keys write it as %s?key=<hex public key> "
                      "(meshctl keys show prints it)", endpoint, endpoint)
            return
        if server_key:
            self.static_keys[endpoint] = server_key
        dealer = transport.peer_dealer(self.ctx, self.node_id, self.security.curve, server_key,
                                       self.zmtp_beats)
        dealer.connect(endpoint)
        self.pending_static[endpoint] = dealer
        dealer.send_multipart(P.frames(self._seq_header(Kind.HELLO, None),
                                       self.hello_body(reply=False, via=endpoint)), zmq.NOBLOCK)

    def ensure(self, node_id: str, routers: list[str], pubs: list[str], source: str,
               pubkey: str | None = None) -> Peer:
        """The peer ``node_id``, created if new, (re)connected if its endpoints or key changed."""
        peer = self.peers.get(node_id)
        if peer is None:
            peer = Peer(node_id=node_id, source=source)
            self.peers[node_id] = peer
        if pubkey is not None and pubkey != peer.pubkey:
            peer.pubkey = pubkey
            peer.connected_router = peer.connected_pub = ""  # re-dial pinned to the new key
        if routers:
            peer.routers = list(routers)
        if pubs:
            peer.pubs = list(pubs)
        router = prefer_endpoint(peer.routers, self.interfaces) if peer.routers else ""
        if router and self._plaintext_refused(router):
            router = ""  # never dialled: learned from gossip or discovery, outside loopback
        if router and router != peer.connected_router:
            self.close_dealer(peer)
            adopted = self.pending_static.pop(router, None)
            peer.dealer = adopted or transport.peer_dealer(self.ctx, self.node_id, self.security.curve,
                                                           peer.pubkey or None, self.zmtp_beats)
            # The monitor first, then connect: libzmq emits no event to a monitor attached later,
            # and a refusal can come back within a millisecond. (Attached after connect, a
            # preempted loop missed the HANDSHAKE_FAILED_AUTH of a redial, and the peer, trusting
            # us seconds later, waited for a dial that was never retried: CI, test_security.py.)
            peer.monitor = peer.dealer.get_monitor_socket(
                zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            )
            self.reactor.add(peer.monitor, functools.partial(self._on_monitor, peer))
            if adopted is None:
                peer.dealer.connect(router)
            peer.connected_router = router
            peer.link_up = False
            peer.hello_queued = False
            if adopted is None:
                # The peer drops what a routing id sends before its HELLO. A fresh DEALER queues
                # in order, so greet first: a heartbeat or a request a caller sends next (say the
                # beat that answers a HELLO reply advertising another endpoint) would otherwise
                # reach the peer before the HELLO sent once the handshake is seen, and be dropped.
                with contextlib.suppress(zmq.ZMQError):
                    peer.dealer.send_multipart(P.frames(self._seq_header(Kind.HELLO, peer),
                                                        self.hello_body(reply=False)), zmq.NOBLOCK)
                    peer.hello_queued = True
        pub = prefer_endpoint(peer.pubs, self.interfaces) if peer.pubs else ""
        if pub and self._plaintext_refused(pub):
            pub = ""
        if pub and pub != peer.connected_pub:
            self.close_sub(peer)
            peer.sub = transport.peer_sub(self.ctx, self.max_frame, self.security.curve,
                                          peer.pubkey or None, self.zmtp_beats)
            for key in self.events.topic_keys():
                peer.sub.setsockopt(zmq.SUBSCRIBE, key)
            peer.sub.connect(pub)
            peer.connected_pub = pub
            self.reactor.add(peer.sub, self.events.topic_message)
        return peer

    def _plaintext_refused(self, endpoint: str) -> bool:
        """Insecure mode: refuse (count, log once) a dial outside loopback (plaintext on the LAN)."""
        if not self.security.plaintext_refused(endpoint):
            return False
        self.stats["refused_plaintext_dial"] += 1
        self.quiet.log(f"plaintext:{endpoint}", "not dialling %s in plaintext (--insecure) outside "
                       "loopback; set allow_insecure_lan = true if you really mean it", endpoint)
        return True

    def close_dealer(self, peer: Peer) -> None:
        if peer.monitor is not None:
            self.reactor.remove(peer.monitor)
            if peer.dealer is not None:
                with contextlib.suppress(zmq.ZMQError):
                    peer.dealer.disable_monitor()
            peer.monitor.close(0)
            peer.monitor = None
        if peer.dealer is not None:
            peer.dealer.close(0)
            peer.dealer = None
        peer.connected_router = ""

    def close_sub(self, peer: Peer) -> None:
        if peer.sub is not None:
            self.reactor.remove(peer.sub)
            peer.sub.close(0)
            peer.sub = None
        peer.connected_pub = ""

    def subscribe_all(self, keys: Iterable[bytes], option: int) -> None:
        """(Un)subscribe every peer's SUB socket: filtering happens at the publisher."""
        for key in keys:
            for peer in self.peers.values():
                if peer.sub is not None:
                    peer.sub.setsockopt(option, key)

    def _on_monitor(self, peer: Peer, frames: list[bytes]) -> None:
        if self.stopping:
            return
        try:
            event = parse_monitor_message(frames)["event"]
        except Exception:
            return
        peer.link_up = event == zmq.EVENT_HANDSHAKE_SUCCEEDED or (peer.link_up and event not in (
            zmq.EVENT_DISCONNECTED, zmq.EVENT_HANDSHAKE_FAILED_AUTH))
        if event == zmq.EVENT_DISCONNECTED:
            self.stats["peer_connection_dropped"] += 1
        if event == zmq.EVENT_DISCONNECTED and peer.state is PeerState.ONLINE:
            # The connection dropped (killed daemon, reset): stale at once, offline by timer.
            log.info("peer %s (%s) connection dropped", peer.node_id, peer.name)
            self.set_state(peer, PeerState.STALE)
        elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            # (Re)connected: a restart, a healed partition, or a peer that just started trusting
            # us. Greet so it (re-)admits us and resyncs; what we queued before may be gone.
            peer.redial_attempts = 0
            if peer.hello_queued:
                peer.hello_queued = False  # the first handshake carries the HELLO queued at dial
            else:
                self.send_hello(peer, reply=False)
        elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH and not peer.redial_pending:
            # The peer does not trust our key (yet). libzmq gives up on that connection; dial
            # again with backoff, so a later `meshctl keys trust` on its side lets us in.
            peer.redial_attempts += 1
            peer.redial_pending = True
            self.quiet.log(f"authfail:{peer.node_id}", "peer %s (%s) refused our key; retrying",
                           peer.node_id, peer.name)
            delay = backoff_delay(peer.redial_attempts, 1.0, 30.0)
            asyncio.get_running_loop().call_later(delay, self._redial, peer, True)

    def _redial(self, peer: Peer, due: bool = False) -> None:
        """Recreate a peer's DEALER and SUB (same endpoints, same pinned key)."""
        if due and not peer.redial_pending:
            return  # it was redialed early (it greeted us: it trusts our key now)
        peer.redial_pending = False
        if self.stopping or self.peers.get(peer.node_id) is not peer:
            return
        peer.connected_router = peer.connected_pub = ""
        self.ensure(peer.node_id, [], [], peer.source)
        self.send_hello(peer, reply=False)

    def readdress(self, router_endpoints: list[str], pub_endpoints: list[str]) -> None:
        """Our addresses changed: dial every peer afresh (from the new address) and greet it with
        the new endpoints, so it re-dials us."""
        self.router_endpoints[:], self.pub_endpoints[:] = router_endpoints, pub_endpoints
        for peer in list(self.peers.values()):
            peer.connected_router = peer.connected_pub = ""
            self.ensure(peer.node_id, [], [], peer.source)
            self.send_hello(peer, reply=False)
