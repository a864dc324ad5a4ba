"""ZAP: the handshake-time gate in front of every CURVE server socket.

libzmq asks the ZAP handler (a socket bound at ``inproc://zeromq.zap.01`` in the same context)
about every new connection to a socket with a ``zap_domain``. We answer from the TrustStore:
a key not trusted gets status 400 and the connection never completes, so an untrusted node gets
nothing in and nothing out. The handler is a ROUTER driven by the node's reactor: no thread and
no future per handshake. It never raises: an exception here would stall every later handshake.
The ZAP ``User-Id`` we return is the client's z85 public key; the node compares it with the
key a peer claims in its HELLO (a routing id alone is self-asserted).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import zmq
from zmq.utils import z85

from .keys import TrustStore

log = logging.getLogger("meshd.auth")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_VERSION = b"1.0"
ZAP_DOMAIN = "meshd"


class ZapHandler:
    """Answers ZAP requests for the ``meshd`` domain from a TrustStore."""

    def __init__(self, ctx: zmq.Context[Any], trust: TrustStore) -> None:
        self.trust = trust
        self.stats: Counter[str] = Counter()
        self._refused_logged: set[str] = set()
        self.sock: zmq.Socket[Any] = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)

    def close(self) -> None:
        self.sock.close(0)

    def handle(self, frames: list[bytes]) -> None:
        """One ZAP request: [rid, b"", version, request_id, domain, address, identity, mechanism, *creds]."""
        try:
            reply = self._decide(frames)
        except Exception:  # never let a bad request stop the authenticator
            log.exception("ZAP request could not be handled; refusing")
            self.stats["zap_errors"] += 1
            if len(frames) < 4:
                return
            reply = [frames[0], b"", ZAP_VERSION, frames[3], b"500", b"internal error", b"", b""]
        try:
            self.sock.send_multipart(reply, zmq.NOBLOCK)
        except zmq.ZMQError:
            self.stats["zap_reply_failed"] += 1

    def _decide(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 8:
            raise ValueError(f"short ZAP request ({len(frames)} frames)")
        rid, _, version, request_id, domain, address, _identity, mechanism = frames[:8]
        creds = frames[8:]

        def answer(code: bytes, text: bytes, user_id: bytes = b"") -> list[bytes]:
            return [rid, b"", ZAP_VERSION, request_id, code, text, user_id, b""]

        if version != ZAP_VERSION:
            return answer(b"400", b"unsupported ZAP version")
        if domain.decode(errors="replace") != ZAP_DOMAIN:
            self.stats["auth_refused_domain"] += 1
            return answer(b"400", b"unknown domain")
        if mechanism != b"CURVE" or len(creds) != 1 or len(creds[0]) != 32:
            self.stats["auth_refused_mechanism"] += 1
            return answer(b"400", b"CURVE required")
        key = z85.encode(creds[0]).decode()
        if self.trust.is_trusted(key):
            self.stats["auth_accepted"] += 1
            return answer(b"200", b"OK", key.encode())
        self.stats["auth_refused"] += 1
        if key not in self._refused_logged:
            self._refused_logged.add(key)
            log.warning("refused untrusted key %s from %s", key, address.decode(errors="replace"))
        return answer(b"400", b"key not trusted")

    def forget_refusals(self) -> None:
        """After a trust change, log a refused key again if it is still refused."""
        self._refused_logged.clear()
