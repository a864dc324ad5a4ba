"""Peer discovery over mDNS / DNS-SD (zeroconf), entirely in the caller's asyncio loop.

Each daemon advertises one ``_meshd._tcp.local.`` service and browses for the others. The TXT
record is authoritative (node id, mesh, protocol version, ROUTER/PUB ports, human name, CURVE
public key); the instance name only has to be unique, so it is ``<mesh>-<node_id>`` with the mesh
part sanitised and truncated to fit the 63-byte DNS label.

Only the configured interfaces are used (IPv4 only). ``Discovery`` never falls back to zeroconf's
"all interfaces" default: an empty interface list is an error, and the daemon resolves its
defaults explicitly with :func:`default_interfaces`.

mDNS record TTLs are long, so a peer killed with SIGKILL stays "found" here until its records
expire; liveness comes from heartbeats. A clean :meth:`Discovery.stop` sends goodbye packets, and
peers receiving them report ``on_lost`` at once.

Discovery never gives up. zeroconf's browser queries at start (0, 1, 4, 9 s) and then only
refreshes records near expiry (about an hour): a node whose first seconds on the LAN were lost (a
switch port still listening/learning, a cable plugged in late) would never hear of anyone, and no
one of it. So while the node has no peer, or fewer than the nodes it heard of, it asks again
(``_requery_loop``: 1 s doubling to 10 s while alone, to ``requery_max`` otherwise, jittered, and
at once after an interface change), with the PTR records it already knows as known answers so
nodes it knows stay quiet (RFC 6762 §7.1). A node alone for ``alone_warning_after`` seconds logs
once what it heard.

Owns: the zeroconf instance, our service record and the browser. It must not dial, greet or
judge trust: it reports adverts (``on_found`` / ``on_lost``) and peers.py decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import random
import re
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import ifaddr
from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf._dns import DNSQuestion
from zeroconf._protocol.outgoing import DNSOutgoing
from zeroconf._utils.time import current_time_millis
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf
from zeroconf.const import _CLASS_IN, _FLAGS_QR_QUERY, _TYPE_PTR

from meshd.util.logonce import LogOnce

__all__ = [
    "SERVICE_TYPE",
    "Discovery",
    "PeerAdvert",
    "default_interfaces",
]

log = logging.getLogger("meshd.discovery")

SERVICE_TYPE = "_meshd._tcp.local."

#: How long one resolution attempt of a browsed service may take (milliseconds).
RESOLVE_TIMEOUT_MS = 1500
#: Resolution attempts per Added/Updated event before the service is given up on.
RESOLVE_ATTEMPTS = 3
#: Upper bound on :meth:`Discovery.stop` (goodbyes, browser cancel, socket close).
STOP_TIMEOUT_S = 2.0
#: The first pause of the re-query backoff, and its cap while the node has no peer at all.
REQUERY_FIRST_S = 1.0
REQUERY_ALONE_MAX_S = 10.0

_MAX_LABEL_BYTES = 63
_MAX_NAME_CHARS = 40
_NODE_ID_RE = re.compile(r"^[A-Za-z0-9_]{1,40}$")
_Z85_RE = re.compile(r"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")
_LABEL_UNSAFE_RE = re.compile(r"[^A-Za-z0-9_-]")

_IFF_UP = 0x1
_IFF_MULTICAST = 0x1000
_EXCLUDED_IF_PREFIXES = ("docker", "veth", "br-")


@dataclass(frozen=True)
class PeerAdvert:
    """What a peer advertises: enough to connect to its ROUTER and PUB sockets."""

    node_id: str
    mesh: str
    addresses: tuple[str, ...]
    router_port: int
    pub_port: int
    proto: int
    name: str
    pubkey: str | None

    def _pick_address(self, prefer: Sequence[str]) -> str:
        if not self.addresses:
            raise ValueError(f"peer {self.node_id} advertises no address")
        for wanted in prefer:
            try:
                net = ipaddress.IPv4Network(f"{wanted}/24", strict=False)
            except ValueError:
                continue
            for addr in self.addresses:
                try:
                    if ipaddress.IPv4Address(addr) in net:
                        return addr
                except ValueError:
                    continue
        return self.addresses[0]

    def router_endpoint(self, prefer: Sequence[str] = ()) -> str:
        """``tcp://ADDR:PORT`` of the peer's ROUTER, preferring an address in a /24 of ``prefer``."""
        return f"tcp://{self._pick_address(prefer)}:{self.router_port}"

    def pub_endpoint(self, prefer: Sequence[str] = ()) -> str:
        """``tcp://ADDR:PORT`` of the peer's PUB, preferring an address in a /24 of ``prefer``."""
        return f"tcp://{self._pick_address(prefer)}:{self.pub_port}"


def _truncate_utf8(text: str, max_bytes: int) -> str:
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return text
    return encoded[:max_bytes].decode("utf-8", "ignore")


def _mesh_label_part(mesh: str, node_id: str) -> str:
    """The mesh part of the instance label, sanitised and cut so ``<part>-<node_id>`` fits 63 bytes."""
    budget = _MAX_LABEL_BYTES - len(node_id.encode("utf-8")) - 1
    return _LABEL_UNSAFE_RE.sub("-", mesh)[: max(budget, 0)]


def instance_name(mesh: str, node_id: str) -> str:
    """The full DNS-SD instance name a node of ``mesh`` with ``node_id`` registers."""
    return f"{_mesh_label_part(mesh, node_id)}-{node_id}.{SERVICE_TYPE}"


def _validate_ipv4(addr: str) -> str:
    try:
        parsed = ipaddress.IPv4Address(addr)
    except ValueError:
        raise ValueError(f"not an IPv4 address: {addr!r} (discovery is IPv4 only)")
    if parsed.is_unspecified or parsed.is_multicast:
        raise ValueError(f"not a usable interface address: {addr!r}")
    return str(parsed)


def _parse_port(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"bad port {raw!r}")
    port = int(raw)
    if not 0 < port < 65536:
        raise ValueError(f"port out of range {port}")
    return port


def _txt_str(props: Mapping[bytes, bytes | None], key: bytes, *, required: bool) -> str | None:
    value = props.get(key)
    if value is None:
        if required:
            raise ValueError(f"missing TXT field {key.decode()!r}")
        return None
    return value.decode("utf-8")  # UnicodeDecodeError is a ValueError


def parse_advert(props: Mapping[bytes, bytes | None], addresses: Sequence[str]) -> PeerAdvert:
    """Build a :class:`PeerAdvert` from TXT properties; raises ``ValueError`` on garbage."""
    node_id = _txt_str(props, b"id", required=True)
    mesh = _txt_str(props, b"mesh", required=True)
    proto_raw = _txt_str(props, b"proto", required=True)
    rp = _txt_str(props, b"rp", required=True)
    pp = _txt_str(props, b"pp", required=True)
    assert node_id is not None and mesh is not None and proto_raw is not None
    assert rp is not None and pp is not None
    if not _NODE_ID_RE.match(node_id):
        raise ValueError(f"bad node id {node_id!r}")
    if not mesh:
        raise ValueError("empty mesh")
    if not (proto_raw.isascii() and proto_raw.isdigit()) or len(proto_raw) > 6:
        raise ValueError(f"bad proto {proto_raw!r}")
    name = _txt_str(props, b"name", required=False) or node_id
    pubkey = _txt_str(props, b"pk", required=False) or None
    if pubkey is not None and not _Z85_RE.match(pubkey):
        raise ValueError("bad pk (expected a 40-char z85 key)")
    addrs: list[str] = []
    for addr in addresses:
        with contextlib.suppress(ValueError):
            norm = str(ipaddress.IPv4Address(addr))
            if norm not in addrs:
                addrs.append(norm)
    if not addrs:
        raise ValueError("no IPv4 address")
    return PeerAdvert(
        node_id=node_id,
        mesh=mesh,
        addresses=tuple(addrs),
        router_port=_parse_port(rp),
        pub_port=_parse_port(pp),
        proto=int(proto_raw),
        name=name[:_MAX_NAME_CHARS],
        pubkey=pubkey,
    )


class Discovery:
    """Advertise this daemon and report peers of the same mesh as they come and go.

    ``on_found`` is called with a :class:`PeerAdvert` when a peer is resolved, and again if its
    advert changes (same advert twice is reported once). ``on_lost`` is called with the node id
    when a peer's service is removed (goodbye or record expiry). Both run in the event loop and
    must not block; an exception they raise is logged and otherwise ignored.
    """

    def __init__(
        self,
        *,
        node_id: str,
        mesh: str,
        name: str,
        interfaces: Sequence[str],
        router_port: int,
        pub_port: int,
        proto: int,
        on_found: Callable[[PeerAdvert], None],
        on_lost: Callable[[str], None],
        pubkey: str | None = None,
        on_other_mesh: Callable[[PeerAdvert], None] | None = None,
        connected: Callable[[], set[str]] | None = None,
        requery_max: float = 60.0,
        alone_warning_after: float = 30.0,
    ) -> None:
        if isinstance(interfaces, str):
            raise TypeError("interfaces must be a sequence of IPv4 address strings, not a str")
        if not interfaces:
            raise ValueError("no interfaces given; resolve defaults with default_interfaces()")
        if not _NODE_ID_RE.match(node_id):
            raise ValueError(f"bad node id {node_id!r}")
        if not mesh:
            raise ValueError("mesh name must not be empty")
        for port in (router_port, pub_port):
            if not 0 < port < 65536:
                raise ValueError(f"port out of range: {port}")
        if proto < 0:
            raise ValueError(f"bad protocol version: {proto}")
        if pubkey is not None and not _Z85_RE.match(pubkey):
            raise ValueError("pubkey must be a 40-char z85 CURVE key")
        self.node_id = node_id
        self.mesh = mesh
        self.name = name
        self.router_port = router_port
        self.pub_port = pub_port
        self.proto = proto
        self.pubkey = pubkey
        self._interfaces: list[str] = self._normalize_interfaces(interfaces)
        self._on_found = on_found
        self._on_lost = on_lost
        self._on_other_mesh = on_other_mesh  # nodes of another mesh: listed by meshctl doctor
        #: The node ids that are peers online now (the peer table's answer); None: never re-query.
        self._connected = connected
        self.requery_max = max(requery_max, REQUERY_FIRST_S)
        self.alone_warning_after = alone_warning_after
        self._other_mesh: dict[str, PeerAdvert] = {}  # instance (lower) -> advert, bounded below
        self._requery_task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        #: Re-queries sent (``meshctl node``: discovery.requeries) and the alone-warnings logged.
        self.requeries = 0
        self.alone_warnings = 0
        self._instance_name = instance_name(mesh, node_id)
        self._mesh_prefix = f"{_mesh_label_part(mesh, node_id)}-".lower()

        self._aiozc: AsyncZeroconf | None = None
        self._info: AsyncServiceInfo | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._announce: Awaitable[object] | None = None
        self._resolving: dict[str, asyncio.Task[None]] = {}
        self._known: dict[str, PeerAdvert] = {}  # instance name (lower) -> last advert reported
        self._logged_bad = LogOnce(log)  # bounded: the keys are other hosts' service names
        self._started = False
        self._stopped = False
        self._stop_lock = asyncio.Lock()

    # -- public API -------------------------------------------------------------------------

    @property
    def instance_name(self) -> str:
        return self._instance_name

    @property
    def interfaces(self) -> list[str]:
        return list(self._interfaces)

    async def start(self) -> None:
        """Register our service (no probing: names are unique by node id) and start browsing."""
        if self._started:
            raise RuntimeError("Discovery already started")
        self._started = True
        aiozc = AsyncZeroconf(interfaces=list(self._interfaces), ip_version=IPVersion.V4Only)
        self._aiozc = aiozc
        try:
            self._info = self._build_info()
            self._announce = await aiozc.async_register_service(self._info, cooperating_responders=True)
            self._browser = AsyncServiceBrowser(
                aiozc.zeroconf, SERVICE_TYPE, handlers=[self._on_service_state_change]
            )
        except BaseException:
            await self.stop()
            raise
        if self._connected is not None:
            self._requery_task = asyncio.get_running_loop().create_task(
                self._requery_loop(), name="meshd-discovery-requery")
        log.info(
            "discovery started: %s on %s (mesh %r)",
            self._instance_name,
            ", ".join(self._interfaces),
            self.mesh,
        )

    def send_query(self, known_answers: bool = False) -> bool:
        """Ask for meshd nodes now (one multicast PTR query, as the browser sends); False when
        discovery is not running. From any thread: ``meshd doctor`` asks for it while it listens.
        With ``known_answers`` the PTR records already cached go along, so the nodes they name do
        not answer again (RFC 6762 §7.1); only nodes not heard of yet do."""
        aiozc = self._aiozc
        if aiozc is None or self._stopped:
            return False
        out = DNSOutgoing(_FLAGS_QR_QUERY, multicast=True)
        out.add_question(DNSQuestion(SERVICE_TYPE, _TYPE_PTR, _CLASS_IN))
        if known_answers:
            now = current_time_millis()
            for record in aiozc.zeroconf.cache.async_all_by_details(SERVICE_TYPE, _TYPE_PTR, _CLASS_IN):
                if not record.is_stale(now):
                    out.add_answer_at_time(record, now)
        aiozc.zeroconf.send(out)
        return True

    def heard(self) -> list[PeerAdvert]:
        """The adverts of this mesh's nodes discovery has resolved and not seen go (newest last)."""
        return list(self._known.values())

    def requery_soon(self) -> None:
        """Start the re-query backoff over, asking at once (an interface or address changed)."""
        self._poke.set()

    async def _requery_loop(self) -> None:
        """Ask the LAN again while this node has fewer peers than it heard of, or none."""
        assert self._connected is not None
        delay = REQUERY_FIRST_S
        alone_since: float | None = time.monotonic()
        warned = False
        while True:
            poked = False
            with contextlib.suppress(TimeoutError):
                # full jitter over the second half of the pause: nodes that booted together spread out
                await asyncio.wait_for(self._poke.wait(), delay * random.uniform(0.5, 1.0))
                poked = True
            self._poke.clear()
            if self._stopped or self._aiozc is None:
                return
            try:
                online = self._connected()
            except Exception:
                log.exception("discovery: the peer table could not say which peers are online")
                online = set()
            missing = [ad for ad in self._known.values() if ad.node_id not in online]
            now = time.monotonic()
            if online:
                alone_since, warned = None, False
            elif alone_since is None:
                alone_since = now
            if poked:
                delay = REQUERY_FIRST_S
            if online and not missing and not poked:
                delay = REQUERY_FIRST_S  # all connected: look again in a second, send nothing
                continue
            if self.send_query(known_answers=bool(online)):
                self.requeries += 1
            cap = REQUERY_ALONE_MAX_S if not online else self.requery_max
            delay = min(delay * 2, max(cap, REQUERY_FIRST_S))
            if (alone_since is not None and not warned and self.alone_warning_after > 0
                    and now - alone_since >= self.alone_warning_after):
                warned = True
                self.alone_warnings += 1
                self._warn_alone(now - alone_since)

    def _warn_alone(self, seconds: float) -> None:
        """Log once per spell alone what discovery heard, so an empty mesh is never silent."""
        mine = [f"{ad.name} ({ad.node_id}) at {', '.join(ad.addresses)}" for ad in self._known.values()]
        others = sorted({f"{ad.mesh!r}" for ad in self._other_mesh.values()})
        heard = (f"it heard {len(mine)} node(s) of mesh {self.mesh!r}: {'; '.join(mine[:8])}"
                 f"{' ...' if len(mine) > 8 else ''} (not connected: see `meshctl doctor`)"
                 if mine else f"it heard no node of mesh {self.mesh!r}")
        if others:
            heard += f", and nodes of other meshes {', '.join(others[:8])}"
        log.warning("no peer for %.0f s on %s: %s; %d mDNS queries sent, asking again every %.0f s at "
                    "most (check the switch port, multicast, firewall for UDP 5353; or list peers "
                    "statically)", seconds, ", ".join(self._interfaces), heard, self.requeries,
                    REQUERY_ALONE_MAX_S)

    async def stop(self) -> None:
        """Send goodbyes, stop browsing and close the sockets. Idempotent; bounded by ~2 s."""
        async with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            if self._aiozc is None:
                return
            try:
                await asyncio.wait_for(self._shutdown(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("discovery stop timed out after %.1f s; closing sockets", STOP_TIMEOUT_S)
                self._force_close()
            except Exception:
                log.exception("error while stopping discovery")
                self._force_close()
            log.info("discovery stopped: %s", self._instance_name)

    async def update_interfaces(self, interfaces: Sequence[str] | None = None) -> None:
        """Re-scan the interfaces zeroconf uses, optionally switching to a new address list.

        With no argument the configured list is re-applied (zeroconf binds any address that was
        missing and drops none; with an unchanged explicit list this is effectively a no-op).
        With a new list, sockets are reconciled to it and our A records are re-announced with the
        new addresses. Safe to call before :meth:`start` (only records the list).
        """
        new = self._interfaces if interfaces is None else self._normalize_interfaces(interfaces)
        changed = new != self._interfaces
        self._interfaces = new
        aiozc = self._aiozc
        if aiozc is None or self._stopped:
            return
        await aiozc.async_update_interfaces(interfaces=list(new))
        if changed and self._info is not None:
            self._info = self._build_info()
            rebroadcast = await aiozc.async_update_service(self._info)
            await rebroadcast
            log.info("discovery interfaces now %s", ", ".join(new))
        if changed:
            self.requery_soon()  # a new address, maybe a new LAN: ask at once

    # -- internals ---------------------------------------------------------------------------

    @staticmethod
    def _normalize_interfaces(interfaces: Sequence[str]) -> list[str]:
        if isinstance(interfaces, str):
            raise TypeError("interfaces must be a sequence of IPv4 address strings, not a str")
        if not interfaces:
            raise ValueError("no interfaces given; resolve defaults with default_interfaces()")
        out: list[str] = []
        for addr in interfaces:
            norm = _validate_ipv4(addr)
            if norm not in out:
                out.append(norm)
        return out

    def _build_info(self) -> AsyncServiceInfo:
        props: dict[str, str] = {
            "id": self.node_id,
            "mesh": self.mesh,
            "proto": str(self.proto),
            "rp": str(self.router_port),
            "pp": str(self.pub_port),
            "name": self.name[:_MAX_NAME_CHARS],
        }
        if self.pubkey is not None:
            props["pk"] = self.pubkey
        return AsyncServiceInfo(
            SERVICE_TYPE,
            self._instance_name,
            port=self.router_port,
            properties=props,
            server=f"meshd-{self.node_id}.local.",
            addresses=[socket.inet_aton(a) for a in self._interfaces],
        )

    async def _shutdown(self) -> None:
        requery, self._requery_task = self._requery_task, None
        if requery is not None:
            requery.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await requery
        tasks = list(self._resolving.values())
        self._resolving.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        announce, self._announce = self._announce, None
        if isinstance(announce, asyncio.Future) and not announce.done():
            announce.cancel()
        if self._browser is not None:
            browser, self._browser = self._browser, None
            await browser.async_cancel()
        aiozc = self._aiozc
        if aiozc is None:
            return
        if self._info is not None:
            info, self._info = self._info, None
            try:
                goodbye = await aiozc.async_unregister_service(info)
                await goodbye
            except Exception:
                log.debug("unregistering %s failed", info.name, exc_info=True)
        await aiozc.async_close()
        self._aiozc = None

    def _force_close(self) -> None:
        if self._requery_task is not None:
            self._requery_task.cancel()
        for task in self._resolving.values():
            task.cancel()
        self._resolving.clear()
        aiozc, self._aiozc = self._aiozc, None
        if aiozc is not None:
            with contextlib.suppress(Exception):
                aiozc.zeroconf.close()

    def _on_service_state_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        if self._stopped or service_type != SERVICE_TYPE:
            return
        key = name.lower()
        if key == self._instance_name.lower():
            return  # our own registration
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            old = self._resolving.pop(key, None)
            if old is not None:
                old.cancel()
            task = asyncio.get_running_loop().create_task(
                self._resolve(zeroconf, name, key), name=f"meshd-discovery-resolve:{name}"
            )
            self._resolving[key] = task
            task.add_done_callback(functools.partial(self._resolve_done, key))
        elif state_change is ServiceStateChange.Removed:
            self._removed(name, key)

    def _resolve_done(self, key: str, task: asyncio.Task[None]) -> None:
        if self._resolving.get(key) is task:
            del self._resolving[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("resolving %s failed", key, exc_info=task.exception())

    async def _resolve(self, zc: Zeroconf, name: str, key: str) -> None:
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        for attempt in range(RESOLVE_ATTEMPTS):
            if await info.async_request(zc, RESOLVE_TIMEOUT_MS):
                break
            log.debug("resolving %s: no answer (attempt %d/%d)", name, attempt + 1, RESOLVE_ATTEMPTS)
        else:
            self._log_bad_once(key, "could not resolve %s; ignoring it until it is announced again", name)
            return
        try:
            advert = parse_advert(info.properties, info.parsed_addresses(IPVersion.V4Only))
        except ValueError as exc:
            self._log_bad_once(key, "ignoring service %s: %s", name, exc)
            return
        if advert.node_id == self.node_id:
            return  # ourselves (e.g. a stale record of a previous run under another name)
        if advert.mesh != self.mesh:
            self._log_bad_once(key, "ignoring service %s of other mesh %r", name, advert.mesh)
            self._other_mesh[key] = advert
            while len(self._other_mesh) > 64:
                del self._other_mesh[next(iter(self._other_mesh))]
            if self._on_other_mesh is not None:
                with contextlib.suppress(Exception):
                    self._on_other_mesh(advert)
            return
        if self._stopped:
            return
        previous = self._known.get(key)
        if previous == advert:
            return
        if previous is not None and previous.node_id != advert.node_id:
            self._call_lost(previous.node_id)
        self._known[key] = advert
        self._logged_bad.forget(key)
        log.debug("found peer %s (%s) at %s", advert.node_id, advert.name, ", ".join(advert.addresses))
        try:
            self._on_found(advert)
        except Exception:
            log.exception("on_found callback raised for peer %s", advert.node_id)

    def _removed(self, name: str, key: str) -> None:
        task = self._resolving.pop(key, None)
        if task is not None:
            task.cancel()
        self._logged_bad.forget(key)
        self._other_mesh.pop(key, None)
        previous = self._known.pop(key, None)
        if previous is not None:
            node_id: str | None = previous.node_id
        else:
            # Never resolved (e.g. removed before the TXT arrived): fall back to the instance
            # name, but only for names of our own mesh. The daemon must tolerate unknown ids.
            node_id = self._node_id_from_name(key)
        if node_id is None or node_id == self.node_id:
            return
        log.debug("lost peer %s (%s)", node_id, name)
        self._call_lost(node_id)

    def _node_id_from_name(self, key: str) -> str | None:
        suffix = "." + SERVICE_TYPE.lower()
        if not key.endswith(suffix):
            return None
        label = key[: -len(suffix)]
        if not label.startswith(self._mesh_prefix):
            return None
        node_id = label[len(self._mesh_prefix) :]
        # DNS names are case-insensitive and we matched lowercased: only hex ids survive that.
        if not re.fullmatch(r"[0-9a-f]{1,40}", node_id):
            return None
        return node_id

    def _call_lost(self, node_id: str) -> None:
        try:
            self._on_lost(node_id)
        except Exception:
            log.exception("on_lost callback raised for peer %s", node_id)

    def _log_bad_once(self, key: str, msg: str, *args: object) -> None:
        self._logged_bad.log(key, msg, *args, level=logging.DEBUG)


def _if_flags(ifname: str) -> int | None:
    try:
        return int(Path(f"/sys/class/net/{ifname}/flags").read_text().strip(), 16)
    except (OSError, ValueError):
        return None


def default_interfaces() -> list[str]:
    """IPv4 addresses of every up, multicast-capable interface except loopback, docker*, veth*, br-*.

    Reads addresses with ``ifaddr`` and the interface flags from ``/sys/class/net`` (Linux); an
    interface whose flags cannot be read is left out. Sends nothing.
    """
    out: list[str] = []
    for adapter in ifaddr.get_adapters():
        ifname = adapter.name
        if ifname == "lo" or ifname.startswith(_EXCLUDED_IF_PREFIXES):
            continue
        flags = _if_flags(ifname)
        if flags is None or not flags & _IFF_UP or not flags & _IFF_MULTICAST:
            continue
        for ip in adapter.ips:
            if not isinstance(ip.ip, str):
                continue  # IPv6 entries are tuples
            try:
                addr = ipaddress.IPv4Address(ip.ip)
            except ValueError:
                continue
            if addr.is_loopback or addr.is_unspecified:
                continue
            text = str(addr)
            if text not in out:
                out.append(text)
    return out
