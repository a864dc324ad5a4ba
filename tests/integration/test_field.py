"""Edge-fleet problems named, on real daemons on 127.0.0.1: untrusted peers visible and
trusted by name, duplicate node ids from a cloned state dir, and ``meshctl doctor``."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from meshd.testing import MeshdFactory, MeshdProcess, wait_until


def _cli(main: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", f"import sys; from meshd.cli import {main}; "
                           f"sys.exit({main}())", *args], capture_output=True, text=True, timeout=60)


def _meshctl(node: MeshdProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return _cli("meshctl_main", "--socket", str(node.socket), *args)


def _discovered(node: MeshdProcess) -> list[dict[str, Any]]:
    done = _meshctl(node, "peers", "--all", "--json")
    assert done.returncode == 0, done.stderr
    return [r for r in json.loads(done.stdout) if r.get("state") == "untrusted"]


def test_an_untrusted_node_is_listed_with_its_fingerprint_and_trusted_by_name(
        meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("fa", secure=True)
    b = meshd_factory.spawn("fb", secure=True)
    wait_until(lambda: any(r["name"] == "fb" for r in _discovered(a)), 15, what="fb listed untrusted at fa")
    row = next(r for r in _discovered(a) if r["name"] == "fb")
    assert row["key"] == b.public_key and row["fingerprint"].startswith("SHA256:")
    assert "meshctl keys trust fb" in a.log() and row["fingerprint"] in a.log()
    doctor = _meshctl(a, "doctor", "--json")
    assert doctor.returncode == 1
    problems = json.loads(doctor.stdout)["problems"]
    assert any(p["code"] == "untrusted" and "fb" in p["message"] for p in problems)
    for node, other in ((a, "fb"), (b, "fa")):
        wait_until(lambda node=node, other=other: any(r["name"] == other for r in _discovered(node)), 15,
                   what=f"{other} listed at {node.name}")
        done = _meshctl(node, "keys", "--state-dir", str(node.state_dir), "trust", other)
        assert done.returncode == 0, done.stderr
        assert "SHA256:" in done.stdout
    meshd_factory.wait_mesh([a, b])
    assert not _discovered(a)
    bad = _meshctl(a, "keys", "--state-dir", str(a.state_dir), "trust", "no-such-node")
    assert bad.returncode == 1 and "no untrusted node" in bad.stderr


def test_a_cloned_state_dir_is_detected_on_all_three_nodes_and_reset(meshd_factory: MeshdFactory) -> None:
    c1 = meshd_factory.spawn("c1")
    notify_path = meshd_factory.workdir / "notify.sock"  # d's systemd: STATUS= must name the clone
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(1.0)
    d = meshd_factory.spawn("d", env={"NOTIFY_SOCKET": str(notify_path)})
    meshd_factory.wait_mesh([c1, d])
    c2 = meshd_factory.spawn("c2", start=False)
    c2.state_dir.mkdir(parents=True, exist_ok=True)
    for path in c1.state_dir.iterdir():
        if path.name in ("node_id", "node.key", "node.key_secret") or path.suffix in (".key", ".key_secret"):
            shutil.copy2(path, c2.state_dir / path.name)
    c2.start()
    cloned = c1.node_id
    assert c2.node_id == cloned
    wait_until(lambda: any(p["node"] == cloned and p.get("duplicate") for p in d.query("peers")), 20,
               what="d to mark the duplicate id")
    for node in (d, c1, c2):
        wait_until(lambda node=node: "DUPLICATE NODE ID" in node.log(), 20,
                   what=f"{node.name} to log the duplicate id")
    doctor = _meshctl(d, "doctor", "--json")
    assert doctor.returncode == 1
    assert any(p["code"] == "duplicate_id" for p in json.loads(doctor.stdout)["problems"])
    table = _meshctl(d, "peers")
    assert "DUPLICATE ID" in table.stdout

    def status_names_it() -> bool:
        try:
            return f"duplicate peer ids: {cloned}" in notify.recv(4096).decode()
        except TimeoutError:
            return False

    wait_until(status_names_it, 20, interval=0, what="d's STATUS= to name the duplicate id")
    notify.close()
    c2.stop()
    done = _cli("meshd_main", "reset-identity", "--state-dir", str(c2.state_dir))
    assert done.returncode == 0 and "removed" in done.stdout
    c2.start()
    c2._info = None
    assert c2.node_id != cloned


def _problems(node: MeshdProcess) -> list[dict[str, str]]:
    done = _meshctl(node, "doctor", "--json")
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert (done.returncode == 1) == bool(report["problems"])
    return list(report["problems"])


def test_the_doctor_names_a_node_of_another_mesh_and_one_unreachable_at_its_address(
        meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("da")
    other = meshd_factory.spawn("dx", mesh=f"{meshd_factory.mesh}x")
    wait_until(lambda: any(p["code"] == "other_mesh" and other.node_id in p["message"] for p in _problems(a)),
               15, what="the doctor to name the node of another mesh")
    b = meshd_factory.spawn("db")
    meshd_factory.wait_mesh([a, b])
    assert b.proc is not None
    b.proc.send_signal(signal.SIGSTOP)  # its mDNS record stays; it answers nothing
    try:
        wait_until(lambda: a.peer_states().get(b.node_id) == "offline", 15, what="db offline at da")
        found = [p for p in _problems(a) if p["code"] == "unreachable" and b.node_id in p["message"]]
        assert found and b.router in found[0]["message"]
    finally:
        b.proc.send_signal(signal.SIGCONT)
    meshd_factory.wait_mesh([a, b])
    assert not [p for p in _problems(a) if b.node_id in p["message"]]


def test_meshd_doctor_without_a_daemon_checks_the_interfaces_and_says_so(tmp_path: Path) -> None:
    done = _cli("meshd_main", "doctor", "--json", "--socket", str(tmp_path / "none.sock"),
                "--state-dir", str(tmp_path), "--interface", "127.0.0.1")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["problems"][0]["code"] == "not_running"
    assert report["facts"]["interfaces"][0]["interface"] == "lo"
    assert report["facts"]["accepts_protocols"] == [1]


def test_a_node_of_another_protocol_version_is_listed_and_explained(meshd_factory: MeshdFactory) -> None:
    """A real mDNS advert of this mesh with protocol 2 (as a newer meshd would send) is never
    dialed, and never ignored silently: listed by peers --all and named by the doctor."""
    from zeroconf import IPVersion, ServiceInfo, Zeroconf

    a = meshd_factory.spawn("pa")
    zc = Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    info = ServiceInfo("_meshd._tcp.local.", f"{meshd_factory.mesh}-00000000000000f2._meshd._tcp.local.",
                       port=9, server="meshd-00000000000000f2.local.",
                       addresses=[socket.inet_aton("127.0.0.1")],
                       properties={"id": "00000000000000f2", "mesh": meshd_factory.mesh, "proto": "2",
                                   "rp": "9", "pp": "10", "name": "newer"})
    zc.register_service(info, cooperating_responders=True)
    try:
        def listed() -> list[dict[str, Any]]:
            done = _meshctl(a, "peers", "--all", "--json")
            return [r for r in json.loads(done.stdout) if r.get("node") == "00000000000000f2"]

        rows = wait_until(listed, 15, what="the protocol-2 node listed")
        assert rows[0]["state"] == "other-protocol" and "protocol 2" in rows[0]["detail"]
        problems = [p for p in _problems(a) if p["code"] == "other_protocol"]
        assert problems and "00000000000000f2" in problems[0]["message"]
        assert "speaks protocol 2" in a.log() and "00000000000000f2" not in json.dumps(a.query("peers"))
    finally:
        zc.unregister_service(info)
        zc.close()


def test_the_doctor_counts_the_mdns_a_running_daemon_sends_and_its_peers_answer(
        meshd_factory: MeshdFactory) -> None:
    from meshd.discovery.mdns import instance_name

    a = meshd_factory.spawn("ma")
    b = meshd_factory.spawn("mb")
    meshd_factory.wait_mesh([a, b])
    done = _meshctl(a, "doctor", "--json", "--listen", "2")
    report = json.loads(done.stdout)
    mdns = report["facts"]["mdns"]
    assert mdns["daemon_queried"] is True and mdns["listened_s"] == 2
    (lo,) = mdns["interfaces"]
    assert lo["address"] == "127.0.0.1" and lo["joined"] is True
    # a's own query (looped back) and b's answer naming b's service instance, seen on loopback.
    assert lo["meshd_queries"] >= 1 and lo["meshd_answers"] >= 1, lo
    assert instance_name(meshd_factory.mesh, b.node_id) in lo["meshd_names"], lo
    assert "127.0.0.1" in lo["meshd_answer_sources"]
    assert not any(p["code"] == "no_mdns" for p in report["problems"])
    text = _cli("meshd_main", "doctor", "--socket", str(a.socket), "--listen", "1")
    assert "mdns on lo 127.0.0.1 over 1 s:" in text.stdout, text.stdout + text.stderr
    off = json.loads(_meshctl(a, "doctor", "--json", "--listen", "0").stdout)
    assert "mdns" not in off["facts"]
    bad = _meshctl(a, "doctor", "--listen", "-1")
    assert bad.returncode == 2 and "--listen must be" in bad.stderr
