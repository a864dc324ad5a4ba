"""Mesh security: CURVE keys, the trust store, the ZAP gate and the trust policy.

Owns: the node's CURVE keypair, the :class:`~meshd.mesh.keys.TrustStore`, the ZAP handler (the
handshake-time gate in front of every CURVE server socket) and the decisions that follow from
trust: which server key to pin when dialing (:meth:`Security.server_key`), whether a message on
the mesh ROUTER really comes from the key its sender claims (:meth:`Security.admit`), and the
insecure-mode guard. It must not touch peers, the directory or routing; node.py and peers.py ask
it and act.

ZAP: libzmq asks the handler (a socket bound at ``inproc://zeromq.zap.01`` in the same context)
about every new connection to a socket with a ``zap_domain``. :class:`ZapPolicy` answers from the
TrustStore without any socket (unit-testable): a key not trusted gets status 400 and the
connection never completes, so an untrusted node gets nothing in and nothing out.
:class:`ZapHandler` is a ROUTER driven by the node's reactor: no thread and no future per
handshake. It never raises: an exception there would stall every later handshake. The ZAP
``User-Id`` we return is the client's z85 public key; the node compares it with the key a peer
claims in its HELLO (a routing id alone is self-asserted).
"""

from __future__ import annotations

import ipaddress
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

import zmq
from zmq.utils import z85

from meshd import transport
from meshd.errors import ConfigError
from meshd.mesh.keys import TrustStore, derive_mesh_keypair, load_mesh_secret, load_or_create_node_keys
from meshd.util.logonce import LogOnce

if TYPE_CHECKING:  # meshd.config imports pydantic: not in the daemon's image (meshd/daemon/reexec.py)
    from meshd.config.settings import Settings

__all__ = ["ZAP_DOMAIN", "ZAP_ENDPOINT", "Security", "ZapHandler", "ZapPolicy"]

log = logging.getLogger("meshd.auth")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_VERSION = b"1.0"
ZAP_DOMAIN = "meshd"


class ZapPolicy:
    """Answers ZAP requests for the ``meshd`` domain from a TrustStore. Pure: no socket."""

    def __init__(self, trust: TrustStore) -> None:
        self.trust = trust
        self.stats: Counter[str] = Counter()
        self._refused = LogOnce(log)

    def answer(self, frames: list[bytes]) -> list[bytes] | None:
        """The reply frames for one request ``[rid, b"", version, request_id, domain, address,
        identity, mechanism, *creds]``; None when the request is too short to answer at all.
        Never raises."""
        try:
            return self._decide(frames)
        except Exception:  # never let a bad request stop the authenticator
            log.exception("ZAP request could not be handled; refusing")
            self.stats["zap_errors"] += 1
            if len(frames) < 4:
                return None
            return [frames[0], b"", ZAP_VERSION, frames[3], b"500", b"internal error", b"", b""]

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
        self._refused.log(key, "refused untrusted key %s from %s", key, address.decode(errors="replace"))
        return answer(b"400", b"key not trusted")

    def forget_refusals(self) -> None:
        """After a trust change, log a refused key again if it is still refused."""
        self._refused.clear()


class ZapHandler:
    """The ZAP socket: reads requests, answers with :class:`ZapPolicy`."""

    def __init__(self, ctx: zmq.Context[Any], policy: ZapPolicy) -> None:
        self.policy = policy
        self.sock: zmq.Socket[Any] = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)

    @property
    def stats(self) -> Counter[str]:
        return self.policy.stats

    def close(self) -> None:
        self.sock.close(0)

    def handle(self, frames: list[bytes]) -> None:
        reply = self.policy.answer(frames)
        if reply is None:
            return
        try:
            self.sock.send_multipart(reply, zmq.NOBLOCK)
        except zmq.ZMQError:
            self.policy.stats["zap_reply_failed"] += 1


class Security:
    """The node's keys and trust, set up before any server socket exists."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.curve: transport.Curve | None = None
        self.trust: TrustStore | None = None
        self.zap: ZapHandler | None = None
        #: Keys mode: every peer message must come from the key it claims (the ZAP User-Id).
        self.check_uid = False

    def start(self, ctx: zmq.Context[Any], reactor: transport.Reactor, interfaces: list[str]) -> None:
        """Load keys and trust, bind the ZAP handler. Raises ConfigError for plaintext on a LAN."""
        s = self.settings
        if s.insecure:
            lan = [i for i in interfaces if not ipaddress.ip_address(i).is_loopback]
            if lan and not s.allow_insecure_lan:
                raise ConfigError("insecure", f"plaintext mode on a non-loopback interface "
                                  f"({', '.join(lan)}) is refused; set allow_insecure_lan = true "
                                  "if you really mean it")
            remote = [p for p in s.peers if self.plaintext_refused(p)]
            if remote:
                # HELLO and the directory would cross the LAN in plaintext
                raise ConfigError("peers", f"plaintext mode with static peers outside loopback "
                                  f"({', '.join(remote)}) is refused; use CURVE (drop --insecure) or "
                                  "set allow_insecure_lan = true if you really mean it")
            return
        if s.trust_mode == "secret":
            if s.mesh_secret_file is None:
                raise ConfigError("mesh_secret_file", "trust_mode secret needs mesh_secret_file")
            pair = derive_mesh_keypair(load_mesh_secret(s.mesh_secret_file))
            self.trust = TrustStore("secret", None, mesh_public=pair.public)
        else:
            pair = load_or_create_node_keys(s.state_dir)
            self.trust = TrustStore("keys", s.resolved_authorized_keys())
            self.check_uid = True
        self.curve = transport.Curve(pair.public, pair.secret)
        self.zap = ZapHandler(ctx, ZapPolicy(self.trust))
        reactor.add(self.zap.sock, self.zap.handle)

    def plaintext_refused(self, endpoint: str) -> bool:
        """Insecure mode: may we NOT talk plaintext to ``endpoint`` (``tcp://HOST:PORT[?...]``)?

        True for any host that is not a loopback address or ``localhost`` (a host name may resolve
        to the LAN), unless ``allow_insecure_lan``. Always False with CURVE on.
        """
        s = self.settings
        if not s.insecure or s.allow_insecure_lan:
            return False
        host = endpoint.partition("?")[0].removeprefix("tcp://").rsplit(":", 1)[0].strip("[]")
        if host == "localhost":
            return False
        try:
            return not ipaddress.ip_address(host).is_loopback
        except ValueError:
            return True

    @property
    def public_key(self) -> str | None:
        return self.curve.public if self.curve else None

    @property
    def secret_mode(self) -> bool:
        return self.trust is not None and self.trust.mode == "secret"

    def server_key(self, claimed: Any) -> str | None:
        """The key to pin when dialing a peer: its own (keys mode) or the mesh key (secret mode).

        None means "do not dial": an untrusted key, or in secret mode a node holding another
        secret. Insecure mode pins nothing (also None); callers check ``curve`` first.
        """
        trust = self.trust
        if trust is None:
            return None
        if trust.mode == "secret":
            # Everyone in the mesh holds the mesh key; a node advertising another key holds
            # another secret: it is not ours, so we do not dial it.
            if isinstance(claimed, str) and claimed != trust.mesh_public:
                return None
            return trust.mesh_public
        return claimed if isinstance(claimed, str) and trust.is_trusted(claimed) else None

    def static_server_key(self, configured: str | None) -> str | None:
        """The key to pin for a configured peer address (its ``?key=`` or the mesh key)."""
        if self.trust is not None and self.trust.mode == "secret":
            return self.trust.mesh_public
        return configured

    def is_trusted(self, key: str) -> bool:
        return self.trust is not None and self.trust.is_trusted(key)

    def admit(self, uid: str, known_key: str | None) -> str | None:
        """Keys mode, one mesh message: None to accept it, else the stats label to drop it with.

        ``uid`` is the ZAP User-Id of the connection; ``known_key`` the key of the greeted peer
        the routing id names (None if not greeted yet).
        """
        if not self.is_trusted(uid):
            return "dropped_untrusted"
        if known_key and known_key != uid:
            return "dropped_spoofed"
        return None

    def reload(self) -> bool:
        """Re-read the authorized-keys folder; True if trust changed. Raises OSError."""
        if self.trust is None or self.trust.mode != "keys":
            return False
        changed = self.trust.reload()
        if changed and self.zap is not None:
            self.zap.policy.forget_refusals()
        return changed

    def stats(self) -> dict[str, int]:
        return dict(self.zap.stats) if self.zap else {}

    def close(self) -> None:
        if self.zap is not None:
            self.zap.close()
