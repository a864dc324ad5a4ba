"""Files and sockets a user may not open: one-line errors and the exit codes systemd relies on.

Real daemons and real meshctl processes. A process that may not open a file is made by dropping every
capability from root (``setpriv --bounding-set -all``) and giving the file or directory to ``nobody``:
root without CAP_DAC_OVERRIDE is held to the file modes like any other user. Root only; skipped
otherwise, saying why.
"""

from __future__ import annotations

import asyncio
import grp
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshd import Agent
from meshd.config.settings import Settings, default_socket_path, find_agent_socket
from meshd.gateway.auth import find_gateway
from meshd.testing import MeshdFactory, short_tempdir, wait_until
from meshd.util import paths

SETPRIV = shutil.which("setpriv")
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or SETPRIV is None or not hasattr(os, "fchown"),
    reason="needs root and setpriv (util-linux) to run a process without file-access capabilities",
)
CTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]


def without_capabilities(*cmd: str) -> list[str]:
    assert SETPRIV is not None
    return [SETPRIV, "--bounding-set", "-all", "--inh-caps", "-all", *cmd]


@pytest.fixture
def workdir() -> Iterator[Path]:
    d = short_tempdir("mshacc-")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@needs_root
def test_meshctl_permission_denied_is_one_line_naming_the_group(workdir: Path) -> None:
    runtime = workdir / "run"
    sock = runtime / "meshd.sock"
    cmd = [sys.executable, "-m", "meshd", "run", "--interface", "127.0.0.1", "--insecure", "--no-discovery",
           "--mesh", f"acc{os.getpid()}", "--state-dir", str(workdir / "st"), "--socket", str(sock)]
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(sock.exists, what="the agent socket")
        nobody = pwd.getpwnam("nobody")
        os.chown(runtime, nobody.pw_uid, nobody.pw_gid)  # 0750 nobody:nogroup: root-without-caps is "other"
        os.chmod(runtime, 0o750)
        env = {**os.environ, "MESHD_SOCKET": str(sock)}
        r = subprocess.run(without_capabilities(*CTL, "peers"), env=env, capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        gname = grp.getgrgid(nobody.pw_gid).gr_name  # named after the directory's group
        assert lines[0].startswith(
            f"meshctl: permission denied on {sock}: add your user to the '{gname}' group")
        assert "usermod -aG" in lines[0] and "Traceback" not in r.stderr
        # the same user with access works (the check above is about access, not a broken daemon)
        ok = subprocess.run([*CTL, "node"], env=env, capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0, ok.stderr
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(15) == 0


def test_meshctl_no_daemon_is_one_line(workdir: Path) -> None:
    sock = workdir / "none.sock"
    r = subprocess.run([*CTL, "--socket", str(sock), "peers"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"meshctl: no meshd is listening on {sock}: start it, or say where it "
                                "listens with --socket PATH or MESHD_SOCKET")


@needs_root
def test_unreadable_mesh_secret_exits_2_naming_file_and_fix(workdir: Path) -> None:
    secret = workdir / "mesh.secret"
    r = subprocess.run([*CTL, "keys", "secret", "--owner", "nobody", str(secret)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    info = secret.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (pwd.getpwnam("nobody").pw_uid, 0o600)
    # the daemon runs as a user that does not own the secret: a key error, exit 2, not a restart loop
    state = workdir / "st"
    r = subprocess.run(without_capabilities(
        sys.executable, "-m", "meshd", "run", "--interface", "127.0.0.1", "--no-discovery",
        "--mesh", f"acc{os.getpid()}", "--trust-mode", "secret", "--mesh-secret-file", str(secret),
        "--state-dir", str(state), "--socket", str(workdir / "s.sock")),
        capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stderr
    assert f"{secret}: Permission denied (fix: chown " in r.stderr and "Traceback" not in r.stderr


@needs_root
def test_keys_secret_owner_unknown_user_is_refused(workdir: Path) -> None:
    secret = workdir / "mesh.secret"
    r = subprocess.run([*CTL, "keys", "secret", "--owner", "no-such-user-xyz", str(secret)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "no such user 'no-such-user-xyz'" in r.stderr
    assert not secret.exists()


def test_socket_search_order(tmp_path: Path) -> None:
    systemd_sock = tmp_path / "run-meshd" / "meshd.sock"
    env = {"XDG_RUNTIME_DIR": "/run/user/1000"}
    assert find_agent_socket(env, systemd_sock) == Path("/run/user/1000/meshd/meshd.sock")
    systemd_sock.parent.mkdir()
    assert find_agent_socket(env, systemd_sock) == systemd_sock
    runtime_env = {**env, "RUNTIME_DIRECTORY": "/srv/rt"}
    assert find_agent_socket(runtime_env, systemd_sock) == Path("/srv/rt/meshd.sock")
    assert find_agent_socket({**env, "MESHD_SOCKET": "/x/y.sock"}, systemd_sock) == Path("/x/y.sock")


def test_agent_without_socket_finds_the_systemd_socket(meshd_factory: MeshdFactory, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``Agent()`` with no socket searches as meshctl does: here the "systemd" socket is a real
    daemon's, pointed at through ``meshd.util.paths.SYSTEMD_SOCKET`` (never the real /run)."""
    a = meshd_factory.spawn("a")
    for name in ("MESHD_SOCKET", "RUNTIME_DIRECTORY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # the plain default: nothing there
    monkeypatch.setattr(paths, "SYSTEMD_SOCKET", a.socket)
    assert find_agent_socket() == a.socket
    assert Settings().resolved_socket() == default_socket_path() == tmp_path / "meshd" / "meshd.sock"

    async def scenario() -> str:
        async with Agent("finder") as me:
            assert me.socket_path == a.socket
            return str((await me.node_info())["node"])

    assert asyncio.run(scenario()) == a.node_id
    gateway = wait_until(lambda: _gateway_or_none(), 10, what="find_gateway() via the systemd socket")
    assert gateway.url.startswith("http://127.0.0.1:")


def _gateway_or_none() -> object:
    try:
        return find_gateway()
    except Exception:
        return None
