"""Import a module in a short-lived thread, so the event loop keeps routing during the import.

Owns: :func:`import_in_thread`, for what the daemon imports on first use rather than at start
(aiohttp at the gateway's first connection, the built-in tools' pydantic models at the first tools
list or call: the daemon's idle memory). A large import takes a few hundred milliseconds; on the loop it
would stall routing and heartbeats for that long. Must not touch anything but the import.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import threading
from types import ModuleType

__all__ = ["import_in_thread"]


async def import_in_thread(name: str) -> ModuleType:
    """Import module ``name`` in a short-lived thread; the event loop keeps running meanwhile."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[ModuleType] = loop.create_future()

    def settle(module: ModuleType | None, exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            assert module is not None
            done.set_result(module)

    def work() -> None:
        module: ModuleType | None = None
        error: BaseException | None = None
        try:
            module = importlib.import_module(name)
        except BaseException as exc:  # handed to the awaiting task, which raises it
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, module, error)

    threading.Thread(target=work, name=f"meshd-import-{name}", daemon=True).start()
    return await done
