"""``meshctl keys trust NAME KEY`` takes the key as ``keys show`` prints it, also when the Z85 key
starts with "-" (about one key in 85, which argparse once took for an option: the real-systemd
test failed on it in CI). The real ``meshctl`` command, a state directory of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import zmq

MESHCTL = [sys.executable, "-c", "import sys; from meshd.cli import meshctl_main; sys.exit(meshctl_main())"]


def _key_starting_with_dash() -> str:
    for _ in range(100_000):
        public, _secret = zmq.curve_keypair()
        if public.startswith(b"-"):
            return public.decode()
    raise AssertionError("no key starting with '-' in 100,000 tries")


def test_a_key_starting_with_a_dash_is_trusted_as_pasted(tmp_path: Path) -> None:
    key = _key_starting_with_dash()
    keys_dir = tmp_path / "authorized_keys"
    cmd = [*MESHCTL, "keys", "--state-dir", str(tmp_path), "--authorized-keys-dir", str(keys_dir),
           "trust", "node1", key]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    listed = subprocess.run([*MESHCTL, "keys", "--state-dir", str(tmp_path), "--authorized-keys-dir",
                             str(keys_dir), "list"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "node1" in listed.stdout, (listed.stdout, listed.stderr)
    assert any(key in p.read_text() for p in keys_dir.iterdir()), "the key as given is what is trusted"
