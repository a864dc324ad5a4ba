"""``BlockingAgent``: the asyncio ``Agent`` for scripts without asyncio, on a thread of its own.

Owns: one event loop running in a background thread, and the bounded waits of each blocking call
(never longer than the call's own time-out plus a second). Must not touch: anything of the
agent's beyond its public methods (handlers run in that thread, as the ``Agent`` runs them).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from meshd.client.agent import CONTROL_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, Agent
from meshd.client.gather import GatherReply, GatherSummary
from meshd.client.handlers import ANY_TOPIC, Handler
from meshd.errors import RequestTimeout

__all__ = ["BlockingAgent"]

T = TypeVar("T")


class BlockingAgent:
    """``Agent`` for scripts without asyncio: runs the agent's loop in a background thread.

    Handlers registered with ``on`` run in that thread.
    """

    def __init__(self, name: str, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"meshd-agent-{name}",
                                        daemon=True)
        self._thread.start()
        self.agent = Agent(name, **kwargs)
        try:
            self._call(self.agent.connect(), CONTROL_TIMEOUT * 2)
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout)
        except TimeoutError:
            if fut.done():
                raise  # the agent's own RequestTimeout, with its message
            fut.cancel()
            raise RequestTimeout("call did not finish in time") from None

    def on(self, topic: str = ANY_TOPIC, **contract: Any) -> Callable[[Handler], Handler]:
        """``Agent.on``, typed ones too (``accepts=``, ``returns=``, ``version=``...)."""
        return self.agent.on(topic, **contract)

    def describe(self, name: str) -> list[dict[str, Any]]:
        """The contract records agent ``name`` advertises (``Agent.describe``)."""
        return self._call(self.agent.describe(name), CONTROL_TIMEOUT + 1)

    def send(self, to: str, topic: str, payload: Any = None, **kw: Any) -> str:
        return self._call(self.agent.send(to, topic, payload, **kw), CONTROL_TIMEOUT * 2 + 1)

    def request(self, to: str, topic: str, payload: Any = None, *,
                timeout: float = DEFAULT_REQUEST_TIMEOUT, **kw: Any) -> Any:
        return self._call(self.agent.request(to, topic, payload, timeout=timeout, **kw), timeout + 1)

    def gather(self, topic: str, payload: Any = None, *, timeout: float = DEFAULT_REQUEST_TIMEOUT,
               **kw: Any) -> tuple[list[GatherReply], GatherSummary]:
        """``Agent.gather`` run to its end: the replies (in arrival order) and the summary."""
        return self._call(self.agent.gather(topic, payload, timeout=timeout, **kw).collect(), timeout + 2)

    def publish(self, topic: str, payload: Any = None, **kw: Any) -> int | None:
        return self._call(self.agent.publish(topic, payload, **kw), CONTROL_TIMEOUT + 1)

    def subscribe(self, topic: str) -> None:
        self._call(self.agent.subscribe(topic), CONTROL_TIMEOUT + 1)

    def unsubscribe(self, topic: str) -> None:
        self._call(self.agent.unsubscribe(topic), CONTROL_TIMEOUT + 1)

    def agents(self) -> list[dict[str, Any]]:
        return self._call(self.agent.agents(), CONTROL_TIMEOUT + 1)

    def peers(self) -> list[dict[str, Any]]:
        return self._call(self.agent.peers(), CONTROL_TIMEOUT + 1)

    def node_info(self) -> dict[str, Any]:
        return self._call(self.agent.node_info(), CONTROL_TIMEOUT + 1)

    def admin(self, op: str, **args: Any) -> Any:
        return self._call(self.agent.admin(op, **args), CONTROL_TIMEOUT + 1)

    def close(self) -> None:
        try:
            self._call(self.agent.close(), CONTROL_TIMEOUT)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._loop.is_running():
            self._loop.close()

    def __enter__(self) -> BlockingAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
