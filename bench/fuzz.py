"""Fuzz campaign (issue 8, item 24): generated frames at a live daemon's agent socket and mesh
port, plaintext and CURVE, while an agent pair keeps doing normal requests through it.

Frames come from hypothesis strategies (signature right or wrong, a header that is msgpack of a
map built from the protocol's own kinds and keys with values of any type and depth, or raw bytes;
0-5 more frames). The fuzzing connections never register, so every frame set with a valid
signature and a header map carrying a string ``id`` of a kind the daemon answers must be
answered with that ``corr`` ("addressable"). Reported, one line:

    frames=N addressable=A answered=A unanswered=U crashes=C requests_ok=R requests_failed=F
    rss_start_kib=.. rss_end_kib=..

Run (bounded: ~60 s on the shared 2-core box for the default counts):

    .venv/bin/python bench/fuzz.py --frames 100000 --mesh-frames 20000

A short run of the same code is in tests/integration/test_fuzz_short.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
import zmq
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from meshd import Agent
from meshd import protocol as P
from meshd.keys import trust_key
from meshd.process import DaemonProcess

KINDS = sorted(P.KNOWN_KINDS - {"register", "unregister", "ack", "agent_hb", "ping"})
ANSWERED = set(KINDS)  # for a connection that never registered, each of these gets an answer
KEYS = sorted({v for k, v in vars(P).items() if k.isupper() and isinstance(v, str) and len(v) < 16})

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
                    st.text(max_size=40), st.binary(max_size=40))
values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                      max_leaves=12)
headers = st.fixed_dictionaries(
    {"kind": st.one_of(st.sampled_from(KINDS), values),
     "id": st.one_of(st.text(min_size=1, max_size=24), values)},
    optional={k: values for k in KEYS if k not in ("kind", "id")})
plausible = st.fixed_dictionaries(  # near-valid headers, so many frames reach the deeper checks
    {"kind": st.sampled_from(KINDS), "id": st.text(min_size=1, max_size=24)},
    optional={k: scalars for k in ("to", "from", "topic", "corr", "hops", "qos", "deadline", "what", "op")})
signatures = st.one_of(st.just(P.SIGNATURE), st.binary(max_size=6))
header_frames = st.one_of(plausible.map(lambda h: msgpack.packb(h, use_bin_type=True)),
                          headers.map(lambda h: msgpack.packb(h, use_bin_type=True)), st.binary(max_size=64))
frame_sets = st.tuples(signatures, header_frames, st.lists(st.binary(max_size=64), max_size=5))


def _addressable(sig: bytes, header: bytes) -> str | None:
    if sig != P.SIGNATURE or len(header) > P.MAX_HEADER_BYTES:
        return None
    try:
        h = P.unpack_header(header)  # the daemon's own rules for a header that decodes
    except Exception:  # FrameError; TypeError for an unhashable kind is issue 8 item 20's
        return None
    if isinstance(h, dict) and isinstance(h.get("id"), str) and isinstance(h.get("kind"), str) \
            and h["kind"] in ANSWERED \
            and 0 < len(h["id"]) <= P.MAX_ID_LEN:
        return str(h["id"])
    return None


SAMPLES: dict[str, tuple[bytes, int]] = {}  # addressable id -> (header, extra frames), to report misses


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Traffic(threading.Thread):
    """Normal service throughout: one agent asks another, over and over."""

    def __init__(self, socket: Path) -> None:
        super().__init__(daemon=True)
        self.socket, self.ok, self.failed, self.stop = socket, 0, 0, threading.Event()

    def run(self) -> None:
        async def loop() -> None:
            async with Agent("fz-echo", socket=self.socket) as echo, \
                    Agent("fz-ask", socket=self.socket) as ask:
                echo.on("ping")(lambda m: m.payload)
                while not self.stop.is_set():
                    try:
                        ok = await ask.request("fz-echo", "ping", {"t": time.time()}, timeout=10)
                        self.ok += ok is not None
                    except Exception:
                        self.failed += 1
                    await asyncio.sleep(0.01)
        asyncio.run(loop())


def _fuzz_socket(sock: zmq.Socket[Any], n: int, seed: int, expect: set[str], answered: set[str]) -> None:
    def drain() -> None:
        while sock.poll(0):
            frames = sock.recv_multipart()
            try:
                corr = msgpack.unpackb(frames[1], raw=False, strict_map_key=False).get("corr")
            except Exception:
                continue
            if isinstance(corr, str):
                answered.add(corr)

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(frame_sets)
    def one(fs: tuple[bytes, bytes, list[bytes]]) -> None:
        sig, header, rest = fs
        corr = _addressable(sig, header)
        if corr is not None:
            expect.add(corr)
            SAMPLES[corr] = (header, len(rest))
        sock.send_multipart([sig, header, *rest])
        drain()

    one._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
    one()
    end = time.monotonic() + 10
    while not expect <= answered and time.monotonic() < end:
        if sock.poll(200):
            drain()


def run_campaign(frames: int, mesh_frames: int, seed: int = 1, workdir: Path | None = None) -> dict[str, Any]:
    """Fuzz a plaintext daemon (agent socket + mesh port) and a CURVE one (mesh port, with a
    trusted key); returns the figures."""
    base = workdir or Path(tempfile.mkdtemp(prefix="mfz-", dir="/tmp"))
    ctx: zmq.Context[Any] = zmq.Context()
    results: dict[str, Any] = {"frames": 0, "addressable": 0, "answered": 0, "unanswered": 0,
                               "crashes": 0, "requests_ok": 0, "requests_failed": 0}
    public, secret = zmq.curve_keypair()
    for secure in (False, True):
        d = DaemonProcess(f"fz{int(secure)}", f"fz{uuid.uuid4().hex[:8]}", base / f"d{int(secure)}",
                          args=["--interface", "127.0.0.1", "--no-discovery"], insecure=not secure)
        if secure:
            trust_key(d.state_dir / "authorized_keys", "fuzzer", public.decode())
        d.start()
        try:
            d.wait_ready()
            traffic = Traffic(d.socket)
            traffic.start()
            time.sleep(1.0)  # warm-up before the RSS baseline
            rss0 = _rss_kib(d.pid)
            expect: set[str] = set()
            answered: set[str] = set()
            if not secure:
                agent = ctx.socket(zmq.DEALER)
                agent.setsockopt(zmq.LINGER, 0)
                agent.connect(f"ipc://{d.socket}")
                _fuzz_socket(agent, frames, seed, expect, answered)
                agent.close(0)
                results["frames"] += frames
            mesh = ctx.socket(zmq.DEALER)
            mesh.setsockopt(zmq.LINGER, 0)
            mesh.setsockopt(zmq.IDENTITY, b"f" * 16)
            if secure:
                node_key = (d.state_dir / "keys" / "node.key").read_text()
                server = node_key.split('public-key = "')[1].split('"')[0]
                mesh.curve_publickey, mesh.curve_secretkey = public, secret
                mesh.curve_serverkey = server.encode()
            mesh.connect(_mesh_endpoint(d))
            _fuzz_socket(mesh, mesh_frames, seed + 1, set(), set())  # nothing is addressable there
            mesh.close(0)
            results["frames"] += mesh_frames
            traffic.stop.set()
            traffic.join(15)
            results[f"rss_start_kib_{'curve' if secure else 'plain'}"] = rss0
            results[f"rss_end_kib_{'curve' if secure else 'plain'}"] = _rss_kib(d.pid)
            results["addressable"] += len(expect)
            results["answered"] += len(expect & answered)
            results["unanswered"] += len(expect - answered)
            results.setdefault("unanswered_samples", []).extend(
                f"{P.unpack_header(SAMPLES[c][0])!r:.200} +{SAMPLES[c][1]} frames"
                for c in sorted(expect - answered)[:5])
            results["requests_ok"] += traffic.ok
            results["requests_failed"] += traffic.failed
            results["crashes"] += not d.alive()
        finally:
            d.stop()
    ctx.term()
    return results


def _mesh_endpoint(d: DaemonProcess) -> str:
    """The daemon's mesh ROUTER endpoint, from its node info."""
    async def ask() -> str:
        async with Agent(f"fz-probe-{uuid.uuid4().hex[:6]}", socket=d.socket) as me:
            return str((await me.node_info())["routers"][0])
    return asyncio.run(ask())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=100_000, help="frames at the agent socket")
    parser.add_argument("--mesh-frames", type=int, default=20_000, help="frames at each mesh port")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    t0 = time.monotonic()
    results = run_campaign(args.frames, args.mesh_frames, args.seed)
    results["seconds"] = round(time.monotonic() - t0, 1)
    print(" ".join(f"{k}={v}" for k, v in results.items()))
    print(json.dumps(results), file=sys.stderr)
    ok = results["crashes"] == 0 and results["unanswered"] == 0 and results["requests_failed"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
