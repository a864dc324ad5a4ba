"""A spawned agent for the spawn tests: registers from the environment the Spawner gives it.

Prints ``child NAME ready`` and one over-long line, then serves until SIGTERM. With argument
``crash`` it exits 3 at once instead (for the restart tests).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from meshd import Agent


async def main() -> int:
    if sys.argv[1:] == ["crash"]:
        print("crashing on purpose", flush=True)
        return 3
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    caps = [c for c in os.environ["MESHD_CAPABILITIES"].split(",") if c]
    async with Agent(os.environ["MESHD_AGENT_NAME"], socket=os.environ["MESHD_SOCKET"], capabilities=caps):
        print(f"child {os.environ['MESHD_AGENT_NAME']} ready (spawned by {os.environ['MESHD_SPAWNED_BY']})",
              flush=True)
        print("x" * 5000, flush=True)
        await stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
