"""Runtime and state directories are checked for root too, and state files are 0600 (they hold
keys and messages). Run as root (the daemon's uid matters): another user's 0777 runtime dir, where
that user could move the socket, is refused at start-up with exit 2 and a "cannot start: <path>:
<reason> (fix: ...)" line; our own 0755 state dir is tightened to 0700 and its files to 0600."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshd.testing import MeshdFactory, short_tempdir

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="checks what a root daemon accepts")

NOBODY = 65534


def _run_meshd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshd", "run", "--interface", "127.0.0.1", "--insecure",
                           "--no-discovery", *args], capture_output=True, text=True, timeout=30)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_root_refuses_another_users_world_writable_runtime_dir() -> None:
    d = short_tempdir()
    try:
        run = d / "run"
        run.mkdir()
        os.chown(run, NOBODY, NOBODY)
        os.chmod(run, 0o777)
        r = _run_meshd("--state-dir", str(d / "st"), "--socket", str(run / "s.sock"))
        assert r.returncode == 2, r.stderr
        assert f"cannot start: {run}: owned by uid {NOBODY}" in r.stderr and "fix: chown" in r.stderr
        assert not (run / "s.sock").exists()
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)


def test_a_state_dir_others_can_read_is_tightened_with_its_files(meshd_factory: MeshdFactory) -> None:
    """Our own 0755 state dir (made by `meshctl keys` or an older meshd) with a delivery.db others
    can read: the daemon makes the dir 0700 and the files 0600, and says so."""
    a = meshd_factory.spawn("a", start=False)
    state = a.state_dir
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, 0o755)
    (state / "delivery.db").touch(mode=0o644)
    os.chmod(state / "delivery.db", 0o644)
    a.start()
    assert _mode(state) == 0o700
    assert _mode(state / "delivery.db") == 0o600
    assert "had mode 755: tightened to 700" in a.log()


def test_state_files_are_private(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    state = a.state_dir
    files = ["node_id", "delivery.db", "delivery.db-wal", "delivery.db-shm"]
    modes = {name: _mode(state / name) for name in files if (state / name).exists()}
    print("state file modes:", {k: oct(v) for k, v in modes.items()})
    assert set(modes) >= {"node_id", "delivery.db"}
    assert all(mode == 0o600 for mode in modes.values()), modes
    assert _mode(state) & 0o077 == 0


def test_a_socket_in_a_shared_sticky_directory_leaves_its_mode_alone(meshd_factory: MeshdFactory) -> None:
    """`--socket /tmp/meshd.sock` once tightened /tmp itself to 0750 for the whole host. A sticky,
    world-writable directory (here a 1777 stand-in for /tmp) keeps its mode."""
    d = short_tempdir()
    try:
        shared = d / "tmp"
        shared.mkdir()
        os.chmod(shared, 0o1777)
        proc = subprocess.Popen([sys.executable, "-m", "meshd", "run", "--interface", "127.0.0.1",
                                 "--insecure", "--no-discovery", "--no-http", "--state-dir", str(d / "st"),
                                 "--socket", str(shared / "meshd.sock")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 30
            while not (shared / "meshd.sock").exists():  # the socket is bound after the dir checks
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the daemon never bound its socket"
                time.sleep(0.05)
            assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
            assert _mode(shared / "meshd.sock") == 0o660
        finally:
            proc.terminate()
            proc.wait(10)
        assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=False)
