"""The doctor's DNS parser and per-interface counting (meshd/discovery/mdns_watch.py) on crafted packets:
no sockets. Packets come from zeroconf's own encoder (what daemons send) and by hand (what a
broken or hostile sender could send)."""

from __future__ import annotations

import struct

import pytest
from zeroconf._dns import DNSPointer, DNSQuestion, DNSText
from zeroconf._protocol.outgoing import DNSOutgoing
from zeroconf.const import _CLASS_IN, _FLAGS_AA, _FLAGS_QR_QUERY, _FLAGS_QR_RESPONSE, _TYPE_PTR, _TYPE_TXT

from meshd.discovery.mdns_watch import MAX_SOURCES, InterfaceTraffic, MalformedDns, parse_dns

SERVICE = "_meshd._tcp.local."


def _query(name: str) -> bytes:
    out = DNSOutgoing(_FLAGS_QR_QUERY, multicast=True)
    out.add_question(DNSQuestion(name, _TYPE_PTR, _CLASS_IN))
    (packet,) = out.packets()
    return packet


def _answer(service: str, instance: str) -> bytes:
    out = DNSOutgoing(_FLAGS_QR_RESPONSE | _FLAGS_AA)
    out.add_answer_at_time(DNSPointer(service, _TYPE_PTR, _CLASS_IN, 120, instance), 0)
    out.add_additional_answer(DNSText(instance, _TYPE_TXT, _CLASS_IN, 120, b"\x06node=1"))
    (packet,) = out.packets()
    return packet


def test_a_meshd_query_is_a_question_for_the_service() -> None:
    msg = parse_dns(_query(SERVICE))
    assert not msg.is_response
    assert msg.questions == (SERVICE,) and msg.records == ()
    assert msg.meshd_question


def test_a_meshd_answer_names_the_instance_through_compression() -> None:
    msg = parse_dns(_answer(SERVICE, f"m-abc.{SERVICE}"))
    assert msg.is_response and msg.questions == ()
    assert msg.records == (SERVICE, f"m-abc.{SERVICE}")  # the TXT owner is a compressed name
    assert msg.meshd_records == msg.records


def test_other_services_are_not_meshd() -> None:
    assert not parse_dns(_query("_http._tcp.local.")).meshd_question
    assert parse_dns(_answer("_http._tcp.local.", "web._http._tcp.local.")).meshd_records == ()


@pytest.mark.parametrize(("packet", "why"), [
    (b"\x00" * 11, "shorter than a DNS header"),
    (struct.pack("!6H", 0, 0, 1, 0, 0, 0) + b"\x06_meshd", "past the end"),
    (struct.pack("!6H", 0, 0, 1, 0, 0, 0) + b"\xc0\x0c\x00\x0c\x00\x01", "compression pointers"),
    (struct.pack("!6H", 0, 0x8400, 0, 1, 0, 0) + b"\x00\x00\x0c\x00\x01\x00\x00\x00\x78\x00\x09ab",
     "record data runs past"),
    (struct.pack("!6H", 0, 0, 1, 0, 0, 0) + b"\x40abc\x00\x00\x0c\x00\x01", "label type"),
    (struct.pack("!6H", 0, 0, 300, 0, 0, 0), "more than"),
])
def test_malformed_packets_are_a_typed_error(packet: bytes, why: str) -> None:
    with pytest.raises(MalformedDns, match=why):
        parse_dns(packet)


def test_counts_per_interface_keep_sources_and_names_bounded() -> None:
    t = InterfaceTraffic("eth0", "198.18.0.1")
    t.count(_query(SERVICE), "198.18.0.1")
    t.count(_query("_http._tcp.local."), "198.18.0.9")
    t.count(_answer("_http._tcp.local.", "web._http._tcp.local."), "198.18.0.9")
    t.count(b"garbage", "198.18.0.7")
    for i in range(MAX_SOURCES + 2):
        t.count(_answer(SERVICE, f"n{i}.{SERVICE}"), f"198.18.1.{i}")
    assert (t.packets, t.queries, t.meshd_queries, t.answers, t.meshd_answers, t.malformed) == \
        (MAX_SOURCES + 6, 2, 1, MAX_SOURCES + 3, MAX_SOURCES + 2, 1)
    assert t.meshd_answer_sources == [f"198.18.1.{i}" for i in range(MAX_SOURCES)]
    assert t.meshd_names[:2] == [f"n0.{SERVICE}", f"n1.{SERVICE}"]
    assert t.dropped == 2  # two sources past the bound; the names (MAX_NAMES) all fit
    assert t.as_dict()["interface"] == "eth0"
