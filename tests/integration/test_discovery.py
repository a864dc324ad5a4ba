"""Discovery over real zeroconf, confined to the loopback interface.

Every Discovery here is bound to 127.0.0.1 (IPv4 only): no mDNS packet leaves the machine. Mesh
names are unique per test, so parallel runs (xdist, other checkouts) don't see each other's peers.
No fixed sleeps: every wait is on an event, bounded by ``asyncio.wait_for``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import ifaddr
import pytest

from meshd.discovery import mdns as disc
from meshd.discovery.mdns import SERVICE_TYPE, Discovery, PeerAdvert, default_interfaces, parse_advert

LOOPBACK = ["127.0.0.1"]
WAIT = 10.0
PUBKEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # a z85 CURVE key (40 chars)


def _node_id() -> str:
    return uuid.uuid4().hex[:16]


def _mesh() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@dataclass
class Node:
    """A Discovery plus recorded callbacks and events to wait on."""

    node_id: str
    mesh: str
    found: dict[str, PeerAdvert] = field(default_factory=dict)
    found_at: dict[str, float] = field(default_factory=dict)
    found_ids: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    lost_at: dict[str, float] = field(default_factory=dict)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    disc: Discovery | None = None

    def on_found(self, advert: PeerAdvert) -> None:
        self.found[advert.node_id] = advert
        self.found_ids.append(advert.node_id)
        self.found_at.setdefault(advert.node_id, time.monotonic())
        self._changed.set()

    def on_lost(self, node_id: str) -> None:
        self.lost.append(node_id)
        self.lost_at.setdefault(node_id, time.monotonic())
        self._changed.set()

    async def wait_for(self, pred: Callable[[], bool], limit: float = WAIT) -> None:
        async def loop() -> None:
            while not pred():
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), limit)

    async def wait_found(self, node_id: str, limit: float = WAIT) -> PeerAdvert:
        await self.wait_for(lambda: node_id in self.found, limit)
        return self.found[node_id]

    async def wait_lost(self, node_id: str, limit: float = WAIT) -> None:
        await self.wait_for(lambda: node_id in self.lost, limit)


def make_node(
    mesh: str,
    *,
    node_id: str | None = None,
    name: str = "node",
    router_port: int = 40001,
    pub_port: int = 40002,
    pubkey: str | None = None,
    on_found: Callable[[PeerAdvert], None] | None = None,
) -> Node:
    node = Node(node_id=node_id or _node_id(), mesh=mesh)
    node.disc = Discovery(
        node_id=node.node_id,
        mesh=mesh,
        name=name,
        interfaces=LOOPBACK,
        router_port=router_port,
        pub_port=pub_port,
        proto=1,
        on_found=on_found or node.on_found,
        on_lost=node.on_lost,
        pubkey=pubkey,
    )
    return node


async def start(node: Node) -> float:
    assert node.disc is not None
    await node.disc.start()
    return time.monotonic()


async def stop(*nodes: Node) -> None:
    for node in nodes:
        assert node.disc is not None
        await node.disc.stop()


class _LogWatch(logging.Handler):
    """Sets an event once a meshd.discovery record containing all ``needles`` is emitted."""

    def __init__(self, *needles: str) -> None:
        super().__init__(level=logging.DEBUG)
        self.needles = needles
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if all(n in message for n in self.needles):
            self.seen.set()


class _watch_log:
    def __init__(self, *needles: str) -> None:
        self.handler = _LogWatch(*needles)
        self.logger = logging.getLogger("meshd.discovery")
        self.old_level = self.logger.level

    def __enter__(self) -> _LogWatch:
        self.logger.addHandler(self.handler)
        self.logger.setLevel(logging.DEBUG)
        return self.handler

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.old_level)


# -- unit-level checks (nothing is sent) ---------------------------------------------------------


def test_default_interfaces_excludes_loopback_and_virtual() -> None:
    addrs = default_interfaces()
    print(f"\ndefault_interfaces() = {addrs}")
    assert all(isinstance(a, str) for a in addrs)
    assert "127.0.0.1" not in addrs
    assert not any(a.startswith("127.") for a in addrs)
    assert all(":" not in a for a in addrs)  # IPv4 only
    excluded: set[str] = set()
    for adapter in ifaddr.get_adapters():
        if adapter.name == "lo" or adapter.name.startswith(("docker", "veth", "br-")):
            excluded.update(ip.ip for ip in adapter.ips if isinstance(ip.ip, str))
    assert not excluded & set(addrs)
    assert len(addrs) == len(set(addrs))


def test_default_interfaces_filters_by_name_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    def adapter(name: str, *ips: str | tuple[str, int, int]) -> ifaddr.Adapter:
        return ifaddr.Adapter(name, name, [ifaddr.IP(ip, 24, name) for ip in ips])

    adapters = [
        adapter("lo", "127.0.0.1"),
        adapter("eth0", "192.168.1.10", ("fe80::1", 0, 2)),
        adapter("docker0", "172.17.0.1"),
        adapter("veth1234", "172.17.0.5"),
        adapter("br-abcdef", "172.18.0.1"),
        adapter("wlan0", "10.0.0.7"),  # down
        adapter("tun0", "10.8.0.2"),  # up, no multicast
        adapter("eth1", "192.168.2.10", "192.168.2.10"),
        adapter("gone0", "10.9.9.9"),  # no /sys entry
    ]
    flags = {
        "lo": 0x1049,
        "eth0": 0x1003,
        "docker0": 0x1003,
        "veth1234": 0x1003,
        "br-abcdef": 0x1003,
        "wlan0": 0x1002,
        "tun0": 0x00D1,
        "eth1": 0x1003,
    }
    monkeypatch.setattr(ifaddr, "get_adapters", lambda: adapters)
    monkeypatch.setattr(disc, "_if_flags", flags.get)
    assert default_interfaces() == ["192.168.1.10", "192.168.2.10"]


def test_endpoint_prefers_same_slash24() -> None:
    advert = PeerAdvert(
        node_id="a" * 16,
        mesh="m",
        addresses=("10.0.0.5", "192.168.7.20", "172.16.3.4"),
        router_port=5555,
        pub_port=5556,
        proto=1,
        name="a",
        pubkey=None,
    )
    assert advert.router_endpoint() == "tcp://10.0.0.5:5555"
    assert advert.pub_endpoint() == "tcp://10.0.0.5:5556"
    assert advert.router_endpoint(["192.168.7.1"]) == "tcp://192.168.7.20:5555"
    assert advert.pub_endpoint(["bogus", "172.16.3.200"]) == "tcp://172.16.3.4:5556"
    assert advert.router_endpoint(["192.168.8.1"]) == "tcp://10.0.0.5:5555"


def test_parse_advert_rejects_garbage() -> None:
    good: dict[bytes, bytes | None] = {
        b"id": b"0123456789abcdef",
        b"mesh": b"m",
        b"proto": b"1",
        b"rp": b"5555",
        b"pp": b"5556",
        b"name": b"x" * 60,
        b"pk": PUBKEY.encode(),
    }
    advert = parse_advert(good, ["127.0.0.1", "fe80::1", "127.0.0.1"])
    assert advert.addresses == ("127.0.0.1",)
    assert advert.name == "x" * 40
    assert advert.pubkey == PUBKEY
    assert (
        parse_advert({k: v for k, v in good.items() if k not in (b"name", b"pk")}, ["1.2.3.4"]).pubkey is None
    )
    bad_variants: list[dict[bytes, bytes | None]] = [
        {k: v for k, v in good.items() if k != b"id"},
        {**good, b"rp": b"99999"},
        {**good, b"pp": b"-1"},
        {**good, b"proto": b"one"},
        {**good, b"id": b"not a node id!"},
        {**good, b"mesh": b"\xff\xfe"},
        {**good, b"pk": b"short"},
        {**good, b"rp": None},
    ]
    for props in bad_variants:
        with pytest.raises(ValueError):
            parse_advert(props, ["127.0.0.1"])
    with pytest.raises(ValueError):
        parse_advert(good, [])


def test_constructor_validation() -> None:
    kwargs = dict(
        node_id=_node_id(),
        mesh="m",
        name="n",
        router_port=1,
        pub_port=2,
        proto=1,
        on_found=lambda a: None,
        on_lost=lambda n: None,
    )
    with pytest.raises(ValueError):
        Discovery(interfaces=[], **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Discovery(interfaces=["::1"], **kwargs)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Discovery(interfaces="127.0.0.1", **kwargs)  # type: ignore[arg-type]


def test_instance_name_fits_label() -> None:
    node_id = _node_id()
    d = Discovery(
        node_id=node_id,
        mesh="a.very-long mesh name that goes on and on and on and on and on",
        name="n" * 100,
        interfaces=LOOPBACK,
        router_port=1,
        pub_port=2,
        proto=1,
        on_found=lambda a: None,
        on_lost=lambda n: None,
    )
    label = d.instance_name[: -len(SERVICE_TYPE) - 1]
    assert len(label.encode()) <= 63
    assert label.endswith("-" + node_id)
    assert "." not in label


# -- real zeroconf on 127.0.0.1 ------------------------------------------------------------------


def test_two_nodes_find_each_other() -> None:
    async def main() -> None:
        mesh = _mesh()
        a = make_node(mesh, name="alpha", router_port=41001, pub_port=41002, pubkey=PUBKEY)
        b = make_node(mesh, name="beta", router_port=42001, pub_port=42002)
        try:
            t_a = await start(a)
            t_b = await start(b)
            found_b = await a.wait_found(b.node_id)
            found_a = await b.wait_found(a.node_id)
            print(
                f"\nsame process: A found B {1000 * (a.found_at[b.node_id] - t_b):.1f} ms after B started;"
                f" B found A {1000 * (b.found_at[a.node_id] - t_b):.1f} ms after B started"
                f" ({1000 * (b.found_at[a.node_id] - t_a):.1f} ms after A started)"
            )
            assert found_b == PeerAdvert(
                node_id=b.node_id,
                mesh=mesh,
                addresses=("127.0.0.1",),
                router_port=42001,
                pub_port=42002,
                proto=1,
                name="beta",
                pubkey=None,
            )
            assert found_a.pubkey == PUBKEY
            assert found_a.name == "alpha"
            assert found_a.router_endpoint(["127.0.0.1"]) == "tcp://127.0.0.1:41001"
            assert found_a.pub_endpoint() == "tcp://127.0.0.1:41002"
            assert a.node_id not in a.found and b.node_id not in b.found
        finally:
            await stop(a, b)

    asyncio.run(main())


def test_other_mesh_is_ignored() -> None:
    async def main() -> None:
        mesh = _mesh()
        a = make_node(mesh)
        x = make_node(_mesh())  # another mesh, same service type
        control = make_node(mesh)
        assert x.disc is not None
        try:
            with _watch_log(x.disc.instance_name, "other mesh") as seen_x:
                await start(a)
                await start(x)
                # positive evidence that A saw X's service and dropped it
                await asyncio.wait_for(seen_x.seen.wait(), WAIT)
            await start(control)  # started after X: once A finds it, X has had its chance
            await a.wait_found(control.node_id)
            await control.wait_found(a.node_id)
            assert x.node_id not in a.found
            assert x.node_id not in control.found
            assert x.found == {}  # X ignores the other mesh too
        finally:
            await stop(x)
            # X's goodbye must not surface as on_lost on the other mesh either
            await stop(control)
            await a.wait_lost(control.node_id)
            await stop(a)
        assert x.node_id not in a.lost

    asyncio.run(main())


def test_stop_sends_goodbye_and_peer_is_lost() -> None:
    async def main() -> None:
        mesh = _mesh()
        a = make_node(mesh)
        b = make_node(mesh)
        try:
            await start(a)
            await start(b)
            await a.wait_found(b.node_id)
            await b.wait_found(a.node_id)
            assert b.disc is not None
            t0 = time.monotonic()
            await b.disc.stop()
            stop_s = time.monotonic() - t0
            await a.wait_lost(b.node_id)
            print(
                f"\ngoodbye: A got on_lost {1000 * (a.lost_at[b.node_id] - t0):.1f} ms after B.stop() began;"
                f" B.stop() took {1000 * stop_s:.0f} ms"
            )
            assert stop_s < 2.5
            assert a.lost == [b.node_id]
            await b.disc.stop()  # idempotent
            # B coming back (same node id, new ports) is found again
            b2 = make_node(mesh, node_id=b.node_id, router_port=43001, pub_port=43002)
            a.found.pop(b.node_id)
            try:
                await start(b2)
                again = await a.wait_found(b.node_id)
                assert again.router_port == 43001
            finally:
                await stop(b2)
        finally:
            await stop(a, b)

    asyncio.run(main())


def test_own_service_ignored_and_raising_callback_survives() -> None:
    async def main() -> None:
        mesh = _mesh()
        calls: list[str] = []

        def raising_on_found(advert: PeerAdvert) -> None:
            calls.append(advert.node_id)
            a.on_found(advert)
            raise RuntimeError("callback bug")

        a = make_node(mesh, on_found=raising_on_found)
        b = make_node(mesh)
        c = make_node(mesh)
        try:
            await start(a)
            await start(b)
            await b.wait_found(a.node_id)  # A's own announcement is on the wire
            await a.wait_found(b.node_id)
            await start(c)  # discovery keeps working after the callback raised
            await a.wait_found(c.node_id)
            assert a.node_id not in calls
            assert sorted(calls) == sorted([b.node_id, c.node_id])
            # a no-arg interface re-scan with an unchanged explicit list is harmless
            assert a.disc is not None
            await a.disc.update_interfaces()
            assert a.disc.interfaces == LOOPBACK
        finally:
            await stop(b, c)
            await a.wait_for(lambda: {b.node_id, c.node_id} <= set(a.lost))
            await stop(a)
        assert a.node_id not in a.lost

    asyncio.run(main())


def test_stop_before_start_and_twice() -> None:
    async def main() -> None:
        a = make_node(_mesh())
        assert a.disc is not None
        await a.disc.stop()
        await a.disc.stop()
        b = make_node(_mesh())
        assert b.disc is not None
        await b.disc.start()
        t0 = time.monotonic()
        await asyncio.gather(b.disc.stop(), b.disc.stop())
        assert time.monotonic() - t0 < 2.5
        with pytest.raises(RuntimeError):
            await b.disc.start()

    asyncio.run(main())


_CHILD = textwrap.dedent(
    """
    import asyncio, signal, sys, time
    from meshd.discovery import Discovery

    node_id, mesh = sys.argv[1], sys.argv[2]

    def out(*parts):
        print(*parts, flush=True)

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        d = Discovery(
            node_id=node_id, mesh=mesh, name="child", interfaces=["127.0.0.1"],
            router_port=44001, pub_port=44002, proto=1,
            on_found=lambda a: out("FOUND", a.node_id, time.monotonic()),
            on_lost=lambda n: out("LOST", n, time.monotonic()),
        )
        await d.start()
        out("STARTED", time.monotonic())
        await stop.wait()
        await d.stop()
        out("STOPPED", time.monotonic())

    asyncio.run(main())
    """
)


def test_cross_process_discovery() -> None:
    async def main() -> None:
        mesh = _mesh()
        a = make_node(mesh)
        child_id = _node_id()
        lines: asyncio.Queue[list[str]] = asyncio.Queue()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CHILD,
            child_id,
            mesh,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        stdout = proc.stdout

        async def read_lines() -> None:
            while line := await stdout.readline():
                await lines.put(line.decode().split())

        async def expect(tag: str) -> list[str]:
            while True:
                parts = await asyncio.wait_for(lines.get(), WAIT)
                if parts and parts[0] == tag:
                    return parts

        reader = asyncio.create_task(read_lines())
        try:
            t_a = await start(a)
            started = await expect("STARTED")
            t_child = float(started[1])
            found = await expect("FOUND")
            assert found[1] == a.node_id
            advert = await a.wait_found(child_id)
            assert advert.router_endpoint() == "tcp://127.0.0.1:44001"
            print(
                f"\ncross process: parent found child {1000 * (a.found_at[child_id] - t_child):.1f} ms"
                f" after child's start() returned; child found parent"
                f" {1000 * (float(found[2]) - max(t_a, t_child)):.1f} ms after both were up"
            )
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            await a.wait_lost(child_id)
            lost_ms = 1000 * (a.lost_at[child_id] - t0)
            print(f"cross process goodbye: parent got on_lost {lost_ms:.1f} ms after SIGTERM")
            await expect("STOPPED")
            assert await asyncio.wait_for(proc.wait(), WAIT) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await stop(a)

    asyncio.run(main())
