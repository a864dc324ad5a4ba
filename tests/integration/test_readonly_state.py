"""Read-only state: a state directory on a file system that was
remounted read-only (a failing SD card does that on edge machines) stops start-up with
"cannot start: <path>: ... (fix: ...)" and exit 2, never a raw traceback. Root only: it mounts a
real tmpfs and remounts it read-only (root can write to a mode-0400 file, so chmod shows nothing)."""

from __future__ import annotations

import os
import subprocess

import pytest

from meshd.testing import MeshdFactory, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs (root only)")


def test_a_read_only_state_dir_stops_start_up_with_a_clear_message(meshd_factory: MeshdFactory) -> None:
    d = meshd_factory.spawn("a", start=False)
    d.state_dir.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(d.state_dir)]
    if subprocess.run(mount).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        d.start()
        wait_until(lambda: (d.state_dir / "tasks.db").exists(), what="tasks.db")
        assert d.stop() == 0
        assert subprocess.run(["mount", "-o", "remount,ro", str(d.state_dir)]).returncode == 0
        log = d.start_refused("read-only state")
        assert f"cannot start: {d.state_dir}" in log and "fix: make the state directory writable" in log, log
    finally:
        subprocess.run(["umount", "-l", str(d.state_dir)])
