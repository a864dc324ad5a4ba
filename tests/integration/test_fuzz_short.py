"""A short run of the fuzz campaign (bench/fuzz.py): generated frames at a
live daemon's agent socket and mesh ports (plaintext and CURVE, from a stranger and from a fake
peer that greeted) while normal requests go on. No crash, no traceback, every addressable frame
answered, every normal request served."""

from __future__ import annotations

import importlib.util
from pathlib import Path

FUZZ = Path(__file__).resolve().parents[2] / "bench" / "fuzz.py"


def test_fuzz_short_run(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("meshd_bench_fuzz", FUZZ)
    assert spec is not None and spec.loader is not None
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    results = fuzz.run_campaign(frames=3000, mesh_frames=1500, seed=7, workdir=tmp_path, pool_size=200)
    print("fuzz short run:", " ".join(f"{k}={v}" for k, v in results.items()))
    assert results["frames"] == 3000 + 1500 + 2 * 1500  # agent socket: unregistered + registered
    assert results["crashes"] == 0 and results["tracebacks"] == 0
    assert results["addressable"] > 500 and results["unanswered"] == 0, results["unanswered_samples"]
    assert results["guarded_errors"] == 0 and results["answers_dropped_agent"] == 0
    assert results["peer_greeted_plain"] and results["peer_greeted_curve"]
    assert results["requests_ok"] > 0 and results["requests_failed"] == 0
