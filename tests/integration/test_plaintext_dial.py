"""Plaintext dials, the learned-address half: a daemon in insecure mode on 127.0.0.1 never dials
a LAN address it learns from a peer (the HELLO's own endpoints or its gossip about other nodes)
in plaintext; it counts ``refused_plaintext_dial`` and logs once. The static-peer half
(``--peer`` outside loopback stops start-up) is test_security.py. A real daemon; the "peer" is a
raw DEALER speaking docs/PROTOCOL.md's HELLO."""

from __future__ import annotations

import uuid
from typing import Any

import zmq

from meshd.testing import MeshdFactory, wait_until
from meshd.wire import protocol as P


def test_insecure_mode_never_dials_a_lan_address_learned_from_a_peer(meshd_factory: MeshdFactory) -> None:
    d = meshd_factory.spawn("a")
    fake_node = uuid.uuid4().hex[:16]
    gossiped_node = uuid.uuid4().hex[:16]
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        peer = ctx.socket(zmq.DEALER)
        peer.setsockopt(zmq.LINGER, 0)
        peer.setsockopt(zmq.IDENTITY, f"{fake_node}.{uuid.uuid4().hex[:6]}".encode())
        peer.connect(d.router)
        body = {"node": fake_node, "name": "lan-peer", "mesh": d.mesh, "proto": P.PROTOCOL_VERSION,
                "incarnation": "x1", "dir": {},
                "routers": ["tcp://198.18.0.77:4001"], "pubs": ["tcp://198.18.0.77:4002"],
                "peers": [{"node": gossiped_node, "routers": ["tcp://192.0.2.5:4001"],
                           "pubs": ["tcp://192.0.2.5:4002"], "pk": ""}]}
        peer.send_multipart(P.frames({P.KIND: P.Kind.HELLO, P.ID: P.new_id(), P.FROM: fake_node,
                                      P.SEQ: 1}, P.pack(body)))

        def refused() -> int:
            return int(d.query("node")["stats"].get("refused_plaintext_dial", 0))
        wait_until(lambda: refused() >= 2, 15, what="the LAN endpoints refused, not dialled")
        log = d.log_path.read_text()
        assert "not dialling tcp://198.18.0.77:4001 in plaintext" in log, log
        # Nothing of ours went to those addresses: the daemon has no connection to them.
        peers = {p["node"]: p for p in d.query("peers")}
        assert set(peers) == {fake_node, gossiped_node}, peers  # both learned...
        assert all(p["router"] == "" and p["pub"] == "" for p in peers.values()), peers  # ...none dialled
    finally:
        ctx.destroy(0)
