"""The headline one-way row and the same row with a typed handler, alternating: what validation costs.

    .venv/bin/python bench/typed_row.py [REPS]       # ~8 s per pair

Daemons A and B on 127.0.0.1; a plain ``await me.send(...)`` loop on A (200,000 messages or 3 s,
whichever comes first) to one agent on B with an ``async def`` handler: untyped (compare.py's
headline row), then typed (``@me.on(topic, accepts=BenchPayload)``: each ~300-byte payload is
validated into a 5-field pydantic model before the handler runs). One ``RESULT {json}`` line per
pair and a summary line: the medians and the typed/untyped ratio (the goal: at least 0.8).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys

from compare import Compare  # bench/ is the script's directory, hence on sys.path


def main(reps: int) -> None:
    bench = Compare(False, 1.0, 1.0)
    untyped: list[float] = []
    typed: list[float] = []
    try:
        a = bench.daemon("A")
        a.start()
        a.wait_ready()
        b = bench.daemon("B")
        asyncio.run(bench.discovery(a, b))
        for k in range(reps):
            u = bench.readme_one_way(a, b, f"u{k}")
            t = bench.typed_one_way(a, b, f"t{k}")
            untyped.append(u["rate"])
            typed.append(t["rate"])
            row = {"untyped": u["rate"], "typed": t["rate"], "ratio": t["rate"] / u["rate"],
                   "lost": [u["lost_total"], t["lost_total"]]}
            print("RESULT", json.dumps(row), flush=True)
    finally:
        bench.cleanup()
    mu, mt = statistics.median(untyped), statistics.median(typed)
    print(f"SUMMARY untyped {mu:,.0f} msgs/s, typed {mt:,.0f} msgs/s, typed/untyped {mt / mu:.2f} "
          f"(medians of {reps})", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
