"""CurveZMQ + ZAP on real daemons: trusted nodes talk, untrusted ones get nothing in or out."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

from meshd import Agent
from meshd.mesh.keys import create_mesh_secret, load_or_create_node_keys
from meshd.testing import MeshdFactory, MeshdProcess, short_tempdir, wait_until
from meshd.wire import protocol as P


def online(proc: MeshdProcess) -> set[str]:
    return {n for n, s in proc.peer_states().items() if s == "online"}


def request_across(src: MeshdProcess, dst: MeshdProcess) -> Any:
    async def scenario() -> Any:
        async with Agent("svc", socket=dst.socket) as svc, Agent("cli", socket=src.socket) as cli:
            svc.on("echo")(lambda m: m.payload)
            end = time.monotonic() + 10
            while "svc" not in {a["name"] for a in await cli.agents()}:
                assert time.monotonic() < end, "svc never appeared in the directory"
                await asyncio.sleep(0.05)
            return await cli.request("svc", "echo", {"secret": "payload"}, timeout=5)
    return asyncio.run(scenario())


def can_connect(endpoint: str, server_key: str, client: tuple[bytes, bytes] | None) -> bool:
    """A raw DEALER (CURVE with the given keypair, or plaintext) sends a HELLO; any answer?"""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        if client is not None:
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
            sock.setsockopt(zmq.CURVE_PUBLICKEY, client[0])
            sock.setsockopt(zmq.CURVE_SECRETKEY, client[1])
        sock.connect(endpoint)
        return bool(monitor.poll(1500))
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        ctx.term()


def test_trusted_nodes_talk_untrusted_gets_nothing_then_trust_at_runtime(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", secure=True, start=False)
    b = meshd_factory.spawn("b", secure=True, start=False)
    c = meshd_factory.spawn("c", secure=True, start=False)
    a.trust(b)
    b.trust(a)
    c.trust(a, b)  # c trusts them, but they do not trust c
    for p in (a, b, c):
        p.start()
    meshd_factory.wait_mesh([a, b])
    assert request_across(a, b) == {"secret": "payload"}
    assert "INSECURE" not in a.log()

    # c sees nothing: its dial attempts are refused at the handshake, so it is online nowhere
    wait_until(lambda: a.query("node")["auth"].get("auth_refused", 0) >= 1, what="c refused at a")
    wait_until(lambda: b.query("node")["auth"].get("auth_refused", 0) >= 1, what="c refused at b")
    assert c.node_id not in online(a) and c.node_id not in online(b)
    assert online(c) == set()
    stats = a.query("node")["stats"]
    print("refusals at a:", {k: v for k, v in stats.items() if "auth" in k or "untrusted" in k})

    # a raw socket with a wrong key never completes the handshake; the right kind of key does
    stranger = zmq.curve_keypair()
    assert not can_connect(a.router, a.public_key, stranger)
    assert not can_connect(a.router, a.public_key, None)  # plaintext refused too
    b_keys = load_or_create_node_keys(b.state_dir)
    assert can_connect(a.router, a.public_key, (b_keys.public.encode(), b_keys.secret.encode()))

    # trust c at run time, without a restart: it joins
    a.trust(c)
    b.trust(c)
    meshd_factory.wait_mesh([a, b, c])
    assert request_across(c, a) == {"secret": "payload"}

    # and untrust it again: cut off
    a.untrust(c)
    wait_until(lambda: c.node_id not in online(a), what="c cut off at a")


def test_spoofed_routing_id_is_dropped(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", secure=True, start=False)
    b = meshd_factory.spawn("b", secure=True, start=False)
    a.trust(b)
    b.trust(a)
    a.start()
    b.start()
    meshd_factory.wait_mesh([a, b])
    # a trusted key (b's) used under another node's routing id: the HELLO is refused
    b_keys = load_or_create_node_keys(b.state_dir)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.ROUTING_ID, b"0123456789abcdef")
    sock.setsockopt(zmq.CURVE_SERVERKEY, a.public_key.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, b_keys.public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, b_keys.secret.encode())
    sock.connect(a.router)
    try:
        hello = {"node": "0123456789abcdef", "mesh": a.mesh, "proto": P.PROTOCOL_VERSION,
                 "pk": "x" * 40, "routers": [], "pubs": [], "incarnation": "1", "dir": {"version": 1,
                                                                                      "agents": []}}
        sock.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "hello", "from": "0123456789abcdef"}),
                             msgpack.packb(hello)])
        wait_until(lambda: a.query("node")["stats"].get("malformed_bad_hello", 0) >= 1, what="refused hello")
        assert "0123456789abcdef" not in a.peer_states()
    finally:
        sock.close(0)
        ctx.term()


def test_mesh_secret_mode(meshd_factory: MeshdFactory) -> None:
    secret = meshd_factory.workdir / "mesh.secret"
    create_mesh_secret(secret)
    a = meshd_factory.spawn("a", "--trust-mode", "secret", "--mesh-secret-file", str(secret), secure=True)
    b = meshd_factory.spawn("b", "--trust-mode", "secret", "--mesh-secret-file", str(secret), secure=True)
    other = meshd_factory.workdir / "other.secret"
    create_mesh_secret(other)
    x = meshd_factory.spawn("x", "--trust-mode", "secret", "--mesh-secret-file", str(other), secure=True)
    meshd_factory.wait_mesh([a, b])
    assert request_across(a, b) == {"secret": "payload"}
    assert x.node_id not in online(a) and online(x) == set()


def _run_meshd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshd", "run", *args], capture_output=True, text=True,
                          timeout=30, env=env)


def test_key_file_permissions_refused_and_missing_key_created() -> None:
    d = short_tempdir()
    try:
        state = d / "state"
        pair = load_or_create_node_keys(state)  # a missing key is created
        secret = state / "keys" / "node.key_secret"
        assert oct(secret.stat().st_mode & 0o777) == "0o600"
        assert load_or_create_node_keys(state) == pair  # and kept
        os.chmod(secret, 0o644)
        r = _run_meshd("--interface", "127.0.0.1", "--state-dir", str(state), "--socket", str(d / "s.sock"),
                       "--mesh", "perm-test", "--no-discovery")
        assert r.returncode == 2
        assert "node.key_secret" in r.stderr and "chmod 600" in r.stderr
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_insecure_on_non_loopback_interface_refused() -> None:
    d = short_tempdir()
    try:
        # 192.0.2.1 (TEST-NET-1) is never bound: the refusal comes before any socket
        r = _run_meshd("--interface", "192.0.2.1", "--insecure", "--state-dir", str(d / "st"),
                       "--socket", str(d / "s.sock"), "--no-discovery")
        assert r.returncode == 2
        assert "allow_insecure_lan" in r.stderr and "192.0.2.1" in r.stderr
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_insecure_with_a_static_peer_outside_loopback_refused() -> None:
    """--insecure on 127.0.0.1 with --peer on a LAN address once sent HELLO and
    the directory to the LAN in plaintext. Now refused at start-up (exit 2, naming the key)."""
    d = short_tempdir()
    try:
        for peer in ("tcp://192.0.2.1:7000", "tcp://lan-host.example:7000"):
            r = _run_meshd("--interface", "127.0.0.1", "--insecure", "--peer", peer, "--state-dir",
                           str(d / "st"), "--socket", str(d / "s.sock"), "--no-discovery")
            assert r.returncode == 2, r.stderr
            assert "peers" in r.stderr and peer in r.stderr and "allow_insecure_lan" in r.stderr
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_meshctl_keys_round_trip(tmp_path: Path) -> None:
    state = tmp_path / "st"

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; "
                               "sys.exit(meshctl_main())", "keys", "--state-dir", str(state), *args],
                              capture_output=True, text=True, timeout=30)

    shown = ctl("show")
    assert shown.returncode == 0, shown.stderr
    other = zmq.curve_keypair()[0].decode()
    assert ctl("trust", "peer-1", other).returncode == 0
    listed = ctl("list", "--json")
    assert other in listed.stdout and "peer-1" in listed.stdout
    assert ctl("untrust", "peer-1").returncode == 0
    assert other not in ctl("list", "--json").stdout
    bad = ctl("trust", "peer-2", "not-a-key")
    assert bad.returncode == 2 and "not a CURVE public key" in bad.stderr
    # export writes the public certificate another node can trust as a file
    cert = tmp_path / "me.key"
    assert ctl("export", "-o", str(cert)).returncode == 0
    assert "secret-key" not in cert.read_text()
    assert ctl("trust", "me-again", str(cert)).returncode == 0
    assert load_or_create_node_keys(state).public in ctl("list", "--json").stdout
    # a mesh secret is created 0600 and never overwritten
    secret = tmp_path / "mesh.secret"
    assert ctl("secret", str(secret)).returncode == 0
    assert oct(secret.stat().st_mode & 0o777) == "0o600"
    assert ctl("secret", str(secret)).returncode == 1


def test_oversized_payload_refused_at_the_client_and_peer_frames_disconnect_only_that_peer(
        meshd_factory: MeshdFactory) -> None:
    from meshd import TooLarge

    env = {"MESHD_MAX_PAYLOAD_BYTES": "65536"}
    a = meshd_factory.spawn("a", env=env)
    b = meshd_factory.spawn("b", env=env)
    meshd_factory.wait_mesh([a, b])

    async def client_side() -> None:
        async with Agent("big", socket=a.socket, max_payload_bytes=65536) as big:
            try:
                await big.send("anyone", "x", b"x" * 70000)
            except TooLarge as exc:
                assert "65536" in str(exc)
            else:
                raise AssertionError("oversized payload was not refused")
    asyncio.run(client_side())

    # a raw peer that sends a frame over the daemon's limit is cut off; the mesh goes on
    ctx = zmq.Context()
    rogue = ctx.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    monitor = rogue.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED)
    rogue.connect(a.router)
    try:
        from zmq.utils.monitor import recv_monitor_message
        assert monitor.poll(5000)
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_CONNECTED
        rogue.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "hb"}), b"x" * (65536 + 128 * 1024)])
        assert monitor.poll(5000), "the daemon kept a peer that sent an oversized frame"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        assert a.alive() and b.node_id in online(a)
        assert request_across(b, a) == {"secret": "payload"}
    finally:
        rogue.disable_monitor()
        monitor.close(0)
        rogue.close(0)
        ctx.term()


def test_agent_socket_refuses_other_users(meshd_factory: MeshdFactory) -> None:
    import pwd
    import shutil
    import stat as st

    a = meshd_factory.spawn("a")
    mode = st.S_IMODE(a.socket.stat().st_mode)
    assert mode == 0o660, oct(mode)
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return  # the mode check above is what can be verified without root
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        return
    # open the folders on the way (not the socket) so only the socket's own mode decides
    os.chmod(meshd_factory.workdir, 0o755)
    os.chmod(a.dir, 0o755)
    code = ("import asyncio, sys\n"
            "from meshd import Agent, DaemonUnreachable\n"
            "async def main():\n"
            f"    async with Agent('intruder', socket={str(a.socket)!r}):\n"
            "        pass\n"
            "try:\n    asyncio.run(main())\nexcept (DaemonUnreachable, PermissionError) as e:\n"
            "    print('refused', type(e).__name__); sys.exit(3)\n")
    r = subprocess.run(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups",
                        sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "intruder" not in {x["name"] for x in a.query("agents")}


def test_daemon_refuses_an_oversized_message_from_a_raw_agent(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", env={"MESHD_MAX_PAYLOAD_BYTES": "65536"})
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"ipc://{a.socket}")

    def answer() -> dict[str, Any]:
        while True:
            assert raw.poll(5000), "no answer from the daemon"
            header = msgpack.unpackb(raw.recv_multipart()[1])
            if header["kind"] != "ping":
                return dict(header)
    try:
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "register", "id": "r"}),
                            msgpack.packb({"name": "big-raw"})])
        assert answer()["kind"] == "ok"
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "send", "id": "m1", "from": "big-raw",
                                                        "to": "big-raw", "topic": "t"}), b"x" * 70000])
        err = answer()
        assert err["kind"] == "error" and err["error"]["code"] == "TOO_LARGE" and err["corr"] == "m1"
        assert "65536" in err["error"]["message"]
        assert a.alive() and "big-raw" in {x["name"] for x in a.query("agents")}
    finally:
        raw.close(0)
        ctx.term()


def _peak_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def test_a_huge_frame_on_the_agent_socket_is_cut_off_before_the_daemon_holds_it(
        meshd_factory: MeshdFactory) -> None:
    """The agent socket had no size cap, so a 256 MiB frame was read whole
    (peak RSS 557 MB) before TOO_LARGE. Now a frame over max_payload_bytes + 68 KiB disconnects
    that connection as it arrives: the daemon's peak RSS does not grow by the frame's size, and
    it goes on serving."""
    a = meshd_factory.spawn("a", env={"MESHD_MAX_PAYLOAD_BYTES": "65536"})
    pid = a.pid
    before = _peak_rss_kib(pid)
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    monitor = raw.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    raw.connect(f"ipc://{a.socket}")
    big = 64 * 1024 * 1024
    try:
        raw.send_multipart([P.SIGNATURE, msgpack.packb({"kind": "send", "id": "huge", "to": "x"}),
                            b"\0" * big])
        poller = zmq.Poller()
        poller.register(raw, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        outcome = ""
        while not outcome:
            ready = dict(poller.poll(30000))
            assert ready, "neither an answer nor a disconnect"
            if monitor in ready:
                outcome = "disconnected"
            elif raw in ready:
                header = msgpack.unpackb(raw.recv_multipart()[1])
                if header["kind"] != "ping":
                    outcome = f"answered {header.get('error', {}).get('code')}"
        grown = _peak_rss_kib(pid) - before
        print(f"64 MiB frame on the agent socket: {outcome}, daemon peak RSS grew {grown} KiB")
        assert outcome == "disconnected"
        assert grown < big // 1024 // 2
        assert a.alive() and a.query("node")["node"] == a.node_id  # still serving
    finally:
        raw.disable_monitor()
        monitor.close(0)
        raw.close(0)
        ctx.term()
