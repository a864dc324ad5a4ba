"""What the node knows of one peer (``Peer``) and what the peer table asks of the node (``PeerEvents``).

Their own module so that the peer table and its dialer (meshd/mesh/peer_dial.py) both import
them at module level, with no cycle between the two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import zmq

from meshd.mesh.liveness import PeerState
from meshd.wire.protocol import FrameError

__all__ = ["Peer", "PeerEvents"]


@dataclass(eq=False)
class Peer:
    """Another daemon of the same mesh."""

    node_id: str
    name: str = ""
    routers: list[str] = field(default_factory=list)
    pubs: list[str] = field(default_factory=list)
    incarnation: str = ""
    #: When the current incarnation's first HELLO arrived (our monotonic clock).
    incarnation_at: float = 0.0
    pubkey: str = ""
    source: str = "mdns"
    dealer: zmq.Socket[Any] | None = None
    monitor: zmq.Socket[Any] | None = None
    sub: zmq.Socket[Any] | None = None
    connected_router: str = ""
    connected_pub: str = ""
    greeted: bool = False  # we have had its HELLO: its traffic is accepted
    state: PeerState = PeerState.OFFLINE
    last_seen: float = 0.0
    dir_version: int = -1
    last_sync_request: float = 0.0
    telemetry: dict[str, Any] = field(default_factory=dict)  # agent name -> {state, telemetry}
    redial_attempts: int = 0
    redial_pending: bool = False
    # Both-ways liveness (meshd/mesh/two_way.py): what it echoes of ours, and our DEALER's link to it.
    heard_seq: int | None = None
    last_echo: int = -1
    confirmed_at: float = 0.0
    congested_at: float = 0.0
    link_up: bool = False
    #: A HELLO was queued on a fresh DEALER before anything else: its first handshake needs none.
    hello_queued: bool = False
    echoes: bool = False
    #: The routing ids its DEALERs greeted us from (newest last, at most MAX_RIDS_PER_PEER).
    rids: list[bytes] = field(default_factory=list)

    def info(self, now: float, agents: int) -> dict[str, Any]:
        return {
            "node": self.node_id,
            "name": self.name,
            "state": str(self.state),
            "router": self.connected_router,
            "pub": self.connected_pub,
            "source": self.source,
            "agents": agents,
            "last_seen_ago": round(now - self.last_seen, 3) if self.last_seen else None,
            "confirmed_ago": round(now - self.confirmed_at, 3) if self.confirmed_at else None,
            "key": self.pubkey or None,
        }


@dataclass(frozen=True)
class PeerEvents:
    """What the peer table tells the rest of the node, and what it asks of it."""

    #: A peer changed state (old, new); offline means its agents are gone.
    state_changed: Callable[[Peer, PeerState, PeerState], None]
    #: A peer sent its directory (HELLO or ``dir``): apply the body.
    directory: Callable[[Peer, Any], None]
    #: A peer restarted (new incarnation): what we knew of it is stale.
    restarted: Callable[[Peer], None]
    #: qos-1 acks arrived from a peer.
    acks: Callable[[list[str]], None]
    #: qos-1 units of ours that the receiving agent refused (NACK): ids and its ``error`` map.
    nacks: Callable[[list[str], dict[str, Any]], None]
    #: A malformed control message: count it, keep it as a dead letter.
    reject: Callable[[FrameError, list[bytes], str], None]
    #: A publication arrived on a peer's SUB socket.
    topic_message: Callable[[list[bytes]], None]
    #: The PUB/SUB keys local agents subscribe to (a new SUB subscribes to each).
    topic_keys: Callable[[], Iterable[bytes]]
    #: This node's directory body and version (HELLO, SYNC answers, heartbeats).
    directory_body: Callable[[], dict[str, Any]]
    directory_version: Callable[[], int]
    #: Local agents' telemetry, carried on heartbeats.
    telemetry: Callable[[], dict[str, Any]]
