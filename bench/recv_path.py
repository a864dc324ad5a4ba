"""The receiving agent's CPU per message, alone: real frame sets fed to a real ``Agent``.

A sending client's ``Batcher`` builds the frame sets (batches of ``--batch`` sends, ~300-byte
msgpack payloads built as compare.py's, fresh per message); the daemons forward a batch
unchanged, so these are the frame sets a receiving agent reads. They go to the agent's
``Incoming.on_frames`` (what its reactor calls), with an ``async def`` handler that reads the
payload, as the README's agents do. Nothing else runs: no socket, no daemon. Prints us/msg
(best of ``--repeat``), and with ``--profile`` a cProfile table of one run.

    .venv/bin/python bench/recv_path.py [--messages 200000] [--batch 64] [--def] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import time
from typing import Any

import msgpack
from common import make_payload

from meshd.client import Agent
from meshd.client.batching import Batcher, to_agent
from meshd.wire import protocol as P


def frame_sets(messages: int, batch: int) -> list[list[bytes]]:
    """What the receiver reads: the sender's batches, as its Batcher builds them."""
    out: list[list[bytes]] = []
    sender = Batcher("sender", batch_max=batch, max_payload_bytes=P.DEFAULT_MAX_PAYLOAD_BYTES,
                     push=out.append, schedule=lambda fn: None, busy=lambda: True,
                     on_batch=lambda bid, ids: None)
    key = to_agent("recv")
    for i in range(messages):
        header = {P.KIND: P.Kind.SEND, P.ID: P.new_id(), P.TOPIC: "bench"}
        sender.enqueue(key, header, msgpack.packb(make_payload(i), use_bin_type=True))
    sender.flush()
    return out


def _counting(seen: list[int], plain_def: bool) -> Any:
    """The receiver's handler, as compare.py's: read the payload, count."""
    def on_msg(msg: Any) -> None:
        if msg.payload.get("warm"):
            return
        seen[0] += 1

    async def on_msg_async(msg: Any) -> None:
        if msg.payload.get("warm"):
            return
        seen[0] += 1

    return on_msg if plain_def else on_msg_async


async def run(args: argparse.Namespace) -> None:
    sets = frame_sets(args.messages, args.batch)
    got = 0
    for _ in range(args.repeat):
        agent = Agent("recv", socket="/nonexistent/recv-path-bench.sock")
        seen = [0]
        agent.on("bench")(_counting(seen, args.plain_def))
        on_frames = agent._incoming.on_frames
        prof = cProfile.Profile() if args.profile else None
        t0 = time.process_time()
        if prof is not None:
            prof.enable()
        for frames in sets:
            on_frames(frames)
        if prof is not None:
            prof.disable()
        cpu = time.process_time() - t0
        got = seen[0]
        if got != args.messages:
            raise SystemExit(f"handled {got} of {args.messages}")
        print(f"{cpu / got * 1e6:.2f} us/msg  ({got} msgs, batches of {args.batch}, "
              f"{'def' if args.plain_def else 'async def'} handler)")
        if prof is not None:
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
            break


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--def", dest="plain_def", action="store_true", help="a plain def handler")
    ap.add_argument("--profile", action="store_true")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
