"""What the orchestrator (bench.py) and the helper processes (roles.py) must agree on.

Kept in one place so that both sides run the same payload, the same limits and the same local
protocol signature.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
if str(REPO) not in sys.path:  # so that ``meshd`` imports when run as ``python bench/bench.py``
    sys.path.insert(0, str(REPO))

LOOPBACK = "127.0.0.1"  # the only interface anything here binds to or connects on
HELPER_HARD_TIMEOUT = 90.0  # every helper exits by itself after this, whatever happens
TAIL_IDLE_S = 2.0  # after the sender is done, a receiver gives up when nothing arrived for this long
TAIL_CAP_S = 30.0  # ... and in any case after this long (late messages are not lost messages)
BODY = "x" * 252  # makes the encoded payload ~300 bytes
SIG = b"MSH\x01"  # meshd.wire.protocol.SIGNATURE (checked against the module at start-up)

_PID = f"{os.getpid():x}"


def make_payload(i: int) -> dict[str, Any]:
    """The benchmark payload: a map with a fresh id and timestamp per message (~300 bytes packed)."""
    return {"id": f"{_PID}-{i:x}", "ts": time.time(), "seq": i, "body": BODY}


def payload_size() -> int:
    return len(msgpack.packb(make_payload(123456), use_bin_type=True))
