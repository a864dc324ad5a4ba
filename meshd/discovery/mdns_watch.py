"""Passive mDNS counting for the doctor: queries and answers seen on each chosen interface.

Owns: parsing just enough of a DNS message (header, question names, record names) to tell a
query from an answer and to tell meshd's ``_meshd._tcp.local.`` from other services
(:func:`parse_dns`), and listening on UDP 5353 for a bounded time, joined to 224.0.0.251 on each
chosen interface, counting per interface (:func:`listen`). python-zeroconf has no public hook
for counting queries, hence this.

It must never send: the socket only receives (it joins the group and reads). It binds the
wildcard address with SO_REUSEADDR/SO_REUSEPORT, so a running daemon's zeroconf (bound to its
interface addresses) keeps its port and wins every unicast packet; multicast goes to both.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "MAX_LISTEN_SECONDS",
    "MAX_NAMES",
    "MAX_SOURCES",
    "DnsSummary",
    "InterfaceTraffic",
    "MalformedDns",
    "MdnsListener",
    "listen",
    "parse_dns",
]

MDNS_GROUP = "224.0.0.251"
MDNS_PORT = 5353
MESHD_SERVICE = "_meshd._tcp.local."
#: The longest listen the doctor allows (``--listen`` above it is an error).
MAX_LISTEN_SECONDS = 60.0
#: Source addresses kept per interface (beyond it only the count of dropped ones grows).
MAX_SOURCES = 16
#: meshd instance names kept per interface (same rule).
MAX_NAMES = 32
_MAX_RECORDS = 256  # questions + records read from one message; more is called malformed
_MAX_POINTERS = 32  # compression pointers followed in one name
_IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)  # Linux value when the constant is missing


class MalformedDns(ValueError):
    """A packet that is not a DNS message this parser can read (truncated, looping names...)."""


@dataclass(frozen=True)
class DnsSummary:
    """What the doctor needs from one DNS message."""

    is_response: bool
    questions: tuple[str, ...]
    records: tuple[str, ...]  # owner names of answer, authority and additional records

    @property
    def meshd_question(self) -> bool:
        return any(_is_meshd(n) for n in self.questions)

    @property
    def meshd_records(self) -> tuple[str, ...]:
        return tuple(n for n in self.records if _is_meshd(n))


def _is_meshd(name: str) -> bool:
    return name.lower().endswith(MESHD_SERVICE)


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    """The name at ``offset`` (compression followed) and the offset just after it in place."""
    labels: list[str] = []
    end: int | None = None
    jumps = 0
    while True:
        if offset >= len(data):
            raise MalformedDns(f"name runs past the end of the packet at offset {offset}")
        length = data[offset]
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(data):
                raise MalformedDns("truncated compression pointer")
            jumps += 1
            if jumps > _MAX_POINTERS:
                raise MalformedDns("too many compression pointers (a loop?)")
            if end is None:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | data[offset + 1]
            continue
        if length & 0xC0:
            raise MalformedDns(f"unsupported label type 0x{length:02x}")
        offset += 1
        if length == 0:
            break
        if offset + length > len(data):
            raise MalformedDns("label runs past the end of the packet")
        labels.append(data[offset:offset + length].decode("utf-8", errors="replace"))
        offset += length
    return ".".join(labels) + ".", end if end is not None else offset


def parse_dns(data: bytes) -> DnsSummary:
    """Header, question names and record owner names of one DNS message; MalformedDns if unreadable."""
    if len(data) < 12:
        raise MalformedDns(f"{len(data)} bytes is shorter than a DNS header (12)")
    _id, flags, qd, an, ns, ar = struct.unpack_from("!6H", data)
    if qd + an + ns + ar > _MAX_RECORDS:
        raise MalformedDns(f"{qd + an + ns + ar} entries announced, more than {_MAX_RECORDS}")
    offset = 12
    questions = []
    for _ in range(qd):
        name, offset = _read_name(data, offset)
        if offset + 4 > len(data):
            raise MalformedDns("question runs past the end of the packet")
        offset += 4  # type, class
        questions.append(name)
    records = []
    for _ in range(an + ns + ar):
        name, offset = _read_name(data, offset)
        if offset + 10 > len(data):
            raise MalformedDns("record header runs past the end of the packet")
        (rdlength,) = struct.unpack_from("!H", data, offset + 8)
        offset += 10 + rdlength
        if offset > len(data):
            raise MalformedDns("record data runs past the end of the packet")
        records.append(name)
    return DnsSummary(bool(flags & 0x8000), tuple(questions), tuple(records))


@dataclass
class InterfaceTraffic:
    """Counts for one interface over one listen."""

    interface: str
    address: str
    packets: int = 0
    queries: int = 0
    answers: int = 0
    meshd_queries: int = 0
    meshd_answers: int = 0
    malformed: int = 0
    meshd_answer_sources: list[str] = field(default_factory=list)
    meshd_names: list[str] = field(default_factory=list)
    dropped: int = 0  # sources or names not kept (MAX_SOURCES / MAX_NAMES reached)
    joined: bool = True
    error: str | None = None

    def count(self, data: bytes, source: str) -> None:
        self.packets += 1
        try:
            msg = parse_dns(data)
        except MalformedDns:
            self.malformed += 1
            return
        if not msg.is_response:
            self.queries += 1
            self.meshd_queries += msg.meshd_question
            return
        self.answers += 1
        names = msg.meshd_records
        if not names:
            return
        self.meshd_answers += 1
        self._keep(self.meshd_answer_sources, source, MAX_SOURCES)
        for name in names:
            if name.lower() != MESHD_SERVICE:
                self._keep(self.meshd_names, name, MAX_NAMES)

    def _keep(self, into: list[str], value: str, bound: int) -> None:
        if value in into:
            return
        if len(into) >= bound:
            self.dropped += 1
        else:
            into.append(value)

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


class MdnsListener:
    """A UDP 5353 socket joined to 224.0.0.251 on each chosen interface; it only receives.

    Open it before asking the daemon to query, so the query and its answers wait in the
    socket's buffer; then :meth:`run` counts for a bounded time. OSError if UDP 5353 cannot be
    bound at all (another program holds it without SO_REUSEPORT); an interface that cannot be
    joined comes back with ``joined`` false and ``error`` set.
    """

    def __init__(self, interfaces: list[tuple[str, str]]) -> None:
        self._by_index: dict[int, InterfaceTraffic] = {}
        self.traffic: list[InterfaceTraffic] = []
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "SO_REUSEPORT"):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.setsockopt(socket.IPPROTO_IP, _IP_PKTINFO, 1)
            if hasattr(socket, "IP_MULTICAST_ALL"):  # only the groups joined here, per interface
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_ALL, 0)
            sock.bind(("", MDNS_PORT))
        except OSError:
            sock.close()
            raise
        self._sock = sock
        for ifname, address in interfaces:
            entry = InterfaceTraffic(ifname, address)
            self.traffic.append(entry)
            try:
                index = socket.if_nametoindex(ifname)
                if index in self._by_index:  # a second address on the same interface
                    entry.joined, entry.error = False, f"counted with {self._by_index[index].address}"
                    continue
                mreq = socket.inet_aton(MDNS_GROUP) + socket.inet_aton(address)
                sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
                self._by_index[index] = entry
            except OSError as exc:
                entry.joined, entry.error = False, f"cannot join {MDNS_GROUP} on {address}: {exc}"

    def run(self, seconds: float) -> list[InterfaceTraffic]:
        """Count what arrives for ``seconds`` (at most MAX_LISTEN_SECONDS); then the counts."""
        if not 0 < seconds <= MAX_LISTEN_SECONDS:
            raise ValueError(f"listen seconds must be in (0, {MAX_LISTEN_SECONDS}], not {seconds!r}")
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self._sock], [], [], left)[0]:
                continue
            data, ancdata, _flags, source = self._sock.recvmsg(9000, socket.CMSG_SPACE(12))
            index = next((struct.unpack_from("=i", cdata)[0] for level, kind, cdata in ancdata
                          if level == socket.IPPROTO_IP and kind == _IP_PKTINFO and len(cdata) >= 4),
                         None)
            entry = self._by_index.get(index) if index is not None else None
            if entry is not None:
                entry.count(data, str(source[0]))
        return self.traffic

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> MdnsListener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def listen(interfaces: list[tuple[str, str]], seconds: float) -> list[InterfaceTraffic]:
    """Count mDNS on each ``(interface name, IPv4 address)`` for ``seconds``; never sends."""
    with MdnsListener(interfaces) as listener:
        return listener.run(seconds)
