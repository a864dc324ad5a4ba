"""Issue 8, item 24: a short run of the fuzz campaign (bench/fuzz.py): generated frames at a
live daemon's agent socket and mesh port (plaintext and CURVE) while normal requests go on.
No crash, every addressable frame answered, every normal request served."""

from __future__ import annotations

import importlib.util
from pathlib import Path

FUZZ = Path(__file__).resolve().parents[2] / "bench" / "fuzz.py"


def test_fuzz_short_run(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("meshd_bench_fuzz", FUZZ)
    assert spec is not None and spec.loader is not None
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    results = fuzz.run_campaign(frames=600, mesh_frames=150, seed=7, workdir=tmp_path)
    print("fuzz short run:", " ".join(f"{k}={v}" for k, v in results.items()))
    assert results["frames"] == 600 + 2 * 150
    assert results["crashes"] == 0
    assert results["addressable"] > 0 and results["unanswered"] == 0, results["unanswered_samples"]
    assert results["requests_ok"] > 0 and results["requests_failed"] == 0
