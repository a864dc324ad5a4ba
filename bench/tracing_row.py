"""What tracing costs: the headline one-way and request/reply rows, alternating three ways.

    .venv/bin/python bench/tracing_row.py [REPS]       # ~25 s per round

Daemons A and B on 127.0.0.1, the rows of compare.py (a plain ``await me.send(...)`` loop to an
``async def`` handler; a plain awaited request loop to an echo), with both agents' processes in
one of three OpenTelemetry set-ups (roles.py ``otel_mode``):
  absent  the client as without the ``otel`` extra (the headline: what the rows measured before);
  api     opentelemetry-api importable, no SDK configured: the nil-cost guard's path;
  sdk     the SDK with a batch processor and an exporter that drops every span: every message
          gets its PRODUCER and CONSUMER spans and its traceparent header.
One ``RESULT {json}`` line per round, and a summary: medians and the ratios to ``absent`` (goals:
api within 3 %, sdk within 25 %).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
from typing import Any

from compare import Compare  # bench/ is the script's directory, hence on sys.path

MODES = ("absent", "api", "sdk")


def one_way(bench: Compare, a: Any, b: Any, tag: str, mode: str) -> float:
    row = bench.a_to_b(f"meshd one-way, otel {mode}", a, b, tag, "o", "mesh_recv",
                       {"topic": "bench", "async_handler": True, "otel": mode}, "mesh_send",
                       max_n=bench.max_n, otel=mode)
    return float(row["rate"])


def rtt(bench: Compare, a: Any, b: Any, tag: str, mode: str) -> float:
    echo = bench.ready_helper("mesh_echo", name=f"techo-{tag}", socket=str(b.socket), otel=mode)
    asker = bench.helper("mesh_rtt", name=f"task-{tag}", socket=str(a.socket), to=f"techo-{tag}",
                         otel=mode, **bench.rtt_cfg)
    row = bench._rtt(f"meshd request/reply, otel {mode}", asker, [echo], (a, b))
    return float(row["p50_us"])


def main(reps: int) -> None:
    bench = Compare(False, 1.0, 1.0)
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    p50s: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        a = bench.daemon("A")
        a.start()
        a.wait_ready()
        b = bench.daemon("B")
        asyncio.run(bench.discovery(a, b))
        for k in range(reps):
            row: dict[str, Any] = {}
            for mode in MODES:
                rates[mode].append(one_way(bench, a, b, f"{mode}{k}", mode))
                p50s[mode].append(rtt(bench, a, b, f"{mode}{k}", mode))
                row[mode] = {"one_way": rates[mode][-1], "rtt_p50_us": p50s[mode][-1]}
            print("RESULT", json.dumps(row), flush=True)
    finally:
        bench.cleanup()
    base_rate, base_p50 = statistics.median(rates["absent"]), statistics.median(p50s["absent"])
    for mode in MODES:
        rate, p50 = statistics.median(rates[mode]), statistics.median(p50s[mode])
        print(f"SUMMARY otel {mode:6}: one-way {rate:,.0f} msgs/s ({rate / base_rate:.3f}x), "
              f"request/reply p50 {p50:,.0f} us ({p50 / base_p50:.3f}x) (medians of {reps})", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
