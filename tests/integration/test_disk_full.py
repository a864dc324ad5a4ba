"""A full disk on the sending daemon. qos-1 sends that cannot be stored fail at
once with STORAGE_FULL (never a 10 s DaemonUnreachable), exactly those are never delivered,
what was stored is sent when space returns, and the log has one line per state change. The state
dir is a real 4 MiB tmpfs (root only)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from meshd import Agent, MeshError
from meshd.testing import MeshdFactory, async_wait_until, wait_listed

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root only)")


def _fill(path: Path) -> None:
    """Fill the file system holding ``path`` to the last byte."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 512):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)


def test_sender_disk_full_refuses_at_once_and_resumes(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a", start=False)
    a.state_dir.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(a.state_dir)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        a.start()
        b = meshd_factory.spawn("b")
        meshd_factory.wait_mesh([a, b])
        filler = a.state_dir / "filler"

        async def scenario() -> tuple[dict[str, Any], set[str], set[str]]:
            counts: dict[str, Any] = {"ok": 0, "storage_full": 0, "other": [], "slowest": 0.0}
            stored: set[str] = set()
            handled: set[str] = set()
            async with Agent("producer", socket=a.socket, batch_max=1) as producer, \
                    Agent("consumer", socket=b.socket) as consumer:
                consumer.on("job")(lambda m: handled.add(m.payload["k"]))
                await wait_listed(producer, "consumer")
                for i in range(20):  # a healthy start
                    await producer.send("consumer", "job", {"k": f"pre{i}"}, qos=1)
                    stored.add(f"pre{i}")
                _fill(filler)

                async def one(key: str) -> None:
                    t0 = time.monotonic()
                    try:
                        await producer.send("consumer", "job", {"k": key, "pad": "p" * 2000}, qos=1)
                        counts["ok"] += 1
                        stored.add(key)
                    except MeshError as exc:
                        if exc.code == "STORAGE_FULL":
                            counts["storage_full"] += 1
                        else:
                            counts["other"].append(repr(exc))
                    counts["slowest"] = max(counts["slowest"], time.monotonic() - t0)
                for start in range(0, 200, 20):
                    await asyncio.gather(*(one(f"k{i}") for i in range(start, start + 20)))
                filler.unlink()  # space is back: what was stored goes out, new sends work
                await producer.send("consumer", "job", {"k": "after"}, qos=1)
                stored.add("after")
                await async_wait_until(lambda: stored <= handled, timeout=30)
            return counts, stored, handled

        counts, stored, handled = asyncio.run(scenario())
        log = a.log_tail(0)
        failed_lines = log.count("qos-1 storage failed")
        print(f"disk full: {counts['ok']} stored, {counts['storage_full']} STORAGE_FULL, other "
              f"{len(counts['other'])}, slowest call {counts['slowest']:.2f} s, handled {len(handled)}, "
              f"refused but handled {len(handled - stored)}, failure log lines {failed_lines}, "
              f"tracebacks {log.count('Traceback')}")
        assert counts["other"] == [], counts["other"]
        assert counts["storage_full"] > 0 and counts["ok"] + counts["storage_full"] == 200
        assert handled == stored  # exactly what was stored, nothing refused
        assert failed_lines == 1 and "qos-1 storage recovered" in log
        assert "Traceback" not in log
    finally:
        for p in meshd_factory.procs:
            p.kill()
        subprocess.run(["umount", "-l", str(a.state_dir)])


def test_receiver_disk_full_still_acks_what_it_handled(meshd_factory: MeshdFactory) -> None:
    """Receiver disk full: the receiving daemon cannot write its done-marks. Its agent handled each message
    once, so the sender must not call any of them UNDELIVERABLE: the acks go out from memory."""
    fast = {"MESHD_QOS1_ATTEMPTS": "2", "MESHD_QOS1_ACK_TIMEOUT": "0.5"}
    a = meshd_factory.spawn("a", env=fast)
    b = meshd_factory.spawn("b", start=False)
    b.state_dir.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(b.state_dir)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        b.start()
        meshd_factory.wait_mesh([a, b])

        async def scenario() -> tuple[list[str], list[int], int]:
            undeliverable: list[str] = []
            handled: list[int] = []
            async with Agent("producer", socket=a.socket) as producer, \
                    Agent("consumer", socket=b.socket) as consumer:
                producer.on_error = lambda err, corr: undeliverable.append(str(getattr(err, "code", err)))
                consumer.on("job")(lambda m: handled.append(m.payload["i"]))
                await wait_listed(producer, "consumer")
                _fill(b.state_dir / "filler")
                for start in range(0, 300, 50):
                    await asyncio.gather(*(producer.send("consumer", "job", {"i": i}, qos=1)
                                           for i in range(start, start + 50)))
                await async_wait_until(lambda: len(set(handled)) == 300, timeout=30)

                def settled() -> bool:
                    return int(a.query("node")["qos1"]["pending"]) == 0
                await async_wait_until(settled, timeout=60)  # acked, or given up on
            return undeliverable, handled, int(b.query("node")["qos1"].get("qos1_commit_failed", 0))

        undeliverable, handled, _ = asyncio.run(scenario())
        print(f"receiver disk full: handled {len(handled)} ({len(set(handled))} distinct), sender "
              f"verdict UNDELIVERABLE for {len(undeliverable)}")
        assert sorted(set(handled)) == list(range(300))
        assert undeliverable == []
    finally:
        for p in meshd_factory.procs:
            p.kill()
        subprocess.run(["umount", "-l", str(b.state_dir)])
