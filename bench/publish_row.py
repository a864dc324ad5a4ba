"""Only compare.py's meshd publish row, repeated, with the daemons' publish counters: for A/B runs.

    .venv/bin/python bench/publish_row.py LABEL [REPS]       # ~7 s per repetition

A plain ``await me.publish(...)`` loop on daemon A (200,000 publications or 3 s, whichever comes
first) to 4 subscriber agents with ``async def`` handlers on daemon B, exactly as compare.py's
headline publish row. One ``RESULT {json}`` line per repetition: rate per subscriber, lost, the
publisher's error count and both daemons' counters about publications (cumulative over the
repetitions of one invocation: the daemons are started once). To compare two versions of meshd,
run this from a checkout of each (each with its own venv), alternating, several pairs, and take
medians (bench/README.md, "Publish without loss").
"""

from __future__ import annotations

import asyncio
import json
import sys

from compare import Compare  # bench/ is the script's directory, hence on sys.path

KEYS = ("publish", "hold", "held", "answers", "topic")


def main(label: str, reps: int) -> None:
    bench = Compare(False, 1.0, 1.0)
    try:
        a = bench.daemon("A")
        a.start()
        a.wait_ready()
        b = bench.daemon("B")
        asyncio.run(bench.discovery(a, b))
        for k in range(reps):
            r = bench.readme_publish(a, b, f"p{k}")
            stats = {d.name: {key: v for key, v in bench._daemon_stats(d).items()
                              if any(word in key for word in KEYS)} for d in (a, b)}
            row = {"label": label, "rate": r["rate"], "lost": r["lost_total"], "sent": r["sent"],
                   "sender_errors": r["sender_errors"], "stats": stats}
            print("RESULT", json.dumps(row), flush=True)
    finally:
        bench.cleanup()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
