"""First contact in keys mode across netlab hosts: two fresh hosts with CURVE on and
nothing trusted discover each other, list each other as untrusted with a fingerprint, say the
exact command in their logs, and after `meshctl keys trust NAME` on each (the key the daemon saw in
discovery) form a mesh and answer requests, with no restart and no key copied by hand."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from meshd.client import BlockingAgent
from meshd.testing import short_tempdir, wait_until

from .conftest import FAST, Netlab, NetnsDaemon, _prefix, skip_reason

pytestmark = pytest.mark.multihost


def _meshctl(d: NetnsDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; "
                           "sys.exit(meshctl_main())", "--socket", str(d.socket), *args],
                          capture_output=True, text=True, timeout=60)


def _untrusted(d: NetnsDaemon) -> list[dict[str, Any]]:
    done = _meshctl(d, "peers", "--all", "--json")
    assert done.returncode == 0, done.stderr
    return [r for r in json.loads(done.stdout) if r.get("state") == "untrusted"]


def test_two_fresh_hosts_trust_each_other_by_name_after_discovery() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    lab = Netlab(_prefix())
    workdir = short_tempdir("mshtr-")
    mesh = f"tr{uuid.uuid4().hex[:12]}"
    daemons: dict[int, NetnsDaemon] = {}
    try:
        lab.up(2)
        for i in (1, 2):
            daemons[i] = NetnsDaemon(lab.host(i), f"t{i}", mesh, workdir,
                                     ["--interface", f"198.18.0.{i}", *FAST], secure=True)
            daemons[i].start()
        for i, other in ((1, "t2"), (2, "t1")):
            d = daemons[i]
            wait_until(lambda d=d, other=other: any(r["name"] == other for r in _untrusted(d)), 20,
                       what=f"{other} listed untrusted at t{i}")
            row = next(r for r in _untrusted(d) if r["name"] == other)
            assert row["fingerprint"].startswith("SHA256:")
            assert f"meshctl keys trust {other}" in d.log() and row["fingerprint"] in d.log()
        assert daemons[1].peer_states() == {} or set(daemons[1].peer_states().values()) <= {"offline"}
        for i, other in ((1, "t2"), (2, "t1")):
            d = daemons[i]
            done = _meshctl(d, "keys", "--state-dir", str(d.state_dir), "trust", other)
            assert done.returncode == 0, done.stderr
        for i, other in ((1, 2), (2, 1)):
            wait_until(lambda i=i, other=other: daemons[i].peer_states().get(daemons[other].node_id)
                       == "online", 20, what=f"t{other} online at t{i} after trusting it")
        with BlockingAgent("echo2", socket=daemons[2].socket) as echo, \
                BlockingAgent("asker1", socket=daemons[1].socket) as asker:
            echo.on("echo")(lambda msg: {"got": msg.payload})
            wait_until(lambda: "echo2" in {a["name"] for a in asker.agents()}, 20, what="echo2 listed at t1")
            assert asker.request("echo2", "echo", 7, timeout=10) == {"got": 7}
        assert "INSECURE" not in daemons[1].log()
    finally:
        for d in daemons.values():
            d.terminate()
        lab.down()
        shutil.rmtree(Path(workdir), ignore_errors=True)
