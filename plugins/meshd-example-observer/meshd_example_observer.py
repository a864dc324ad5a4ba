"""meshd-example-observer: a meshd plugin that writes one JSON line per hook call.

The output file is the ``out`` setting of its config section::

    [plugins.example_observer]
    out = "/tmp/observer.jsonl"

declared by :func:`meshd_plugin_config` (a pydantic model) and received, validated, by
:func:`meshd_configure`. Without the setting, the environment variable ``MESHD_EXAMPLE_OBSERVER_OUT``
names the file (read on every call); when neither is set, each call is logged at INFO on the
``meshd_example_observer`` logger instead.

meshd loads this module through the entry point in pyproject.toml::

    [project.entry-points.meshd]
    example_observer = "meshd_example_observer"

and registers the module itself as the plugin: every module-level function marked with
``@hookimpl`` and named like a hook in ``meshd.hookspecs`` is an implementation. A hook may take
any subset of the hook's arguments, by name (see :func:`meshd_peer_state`).

Threads: the observer and dead-letter hooks run on this plugin's own worker thread, the lifecycle
hooks in the daemon's event loop. Both may write here at once, hence the lock. With
``isolation = "process"`` in the section, every hook runs in a child process instead.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from meshd.hookspecs import hookimpl

__all__ = [
    "OUT_ENV",
    "ObserverSettings",
    "meshd_agent_state",
    "meshd_collaboration",
    "meshd_configure",
    "meshd_dead_letter",
    "meshd_peer_state",
    "meshd_plugin_config",
    "meshd_shutdown",
    "meshd_startup",
]

OUT_ENV = "MESHD_EXAMPLE_OBSERVER_OUT"

log = logging.getLogger("meshd_example_observer")
_lock = threading.Lock()
_out: Path | None = None


class ObserverSettings(BaseModel):
    """What ``[plugins.example_observer]`` may hold (besides meshd's own isolation and queue_size)."""

    #: The JSON-lines file to append to; None: $MESHD_EXAMPLE_OBSERVER_OUT, else the log.
    out: Path | None = None


def _emit(hook: str, **fields: Any) -> None:
    """Append ``{"hook": hook, **fields}`` as one JSON line to the ``out`` file, or log it."""
    line = json.dumps({"hook": hook, **fields}, default=str)
    path = _out or os.environ.get(OUT_ENV)
    if not path:
        log.info("%s", line)
        return
    with _lock, open(path, "a", encoding="utf-8") as out:
        out.write(line + "\n")


# -- settings: once, while the daemon loads plugins ----------------------------------------------


@hookimpl
def meshd_plugin_config() -> type[BaseModel]:
    """The model this plugin's config section is validated with: a bad value stops the daemon at
    start-up with an error naming ``plugins.example_observer.<key>``."""
    return ObserverSettings


@hookimpl
def meshd_configure(config: ObserverSettings) -> None:
    """The validated section (defaults filled in), before :func:`meshd_startup`."""
    global _out
    _out = config.out


# -- lifecycle: in the daemon's event loop -------------------------------------------------------


@hookimpl
def meshd_startup(node: Any) -> None:
    """The daemon is up. ``node`` is a ``meshd.view.NodeView``: read its identity (``node_id``,
    ``name``, ``mesh``) and, on the event loop, ``info()``, ``agents()``, ``peers()``.

    This one is a plain function because its work is one small append; anything slower belongs in
    a coroutine (see :func:`meshd_shutdown`), since the routing path shares this event loop.
    """
    _emit("meshd_startup", node=getattr(node, "node_id", None), name=getattr(node, "name", None),
          at=time.time())


@hookimpl
async def meshd_shutdown(node: Any) -> None:
    """The daemon is stopping. Returning a coroutine (``async def``) makes meshd await it, with its
    hook timeout; blocking file I/O goes to a thread so the event loop stays free."""
    await asyncio.to_thread(_emit, "meshd_shutdown", node=getattr(node, "node_id", None), at=time.time())


# -- observers and sinks: on meshd's plugin worker thread ----------------------------------------


@hookimpl
def meshd_collaboration(outcome: dict[str, Any]) -> None:
    """One send, request, delegate or handoff finished (publish is not reported). ``outcome`` is
    this plugin's own copy: keys kind, id, initiator, target, topic, outcome, error_code,
    latency_ms, qos, at. This is where a metrics plugin would update its counters and latency
    histograms."""
    _emit("meshd_collaboration", **outcome)


@hookimpl
def meshd_dead_letter(letter: dict[str, Any]) -> None:
    """A message could not be delivered (or a frame set was malformed). A real sink would store
    the whole letter, frames included, to replay it later; this example records a summary, since
    the frames are bytes."""
    header = letter.get("header") or {}
    frames = letter.get("frames") or []
    _emit("meshd_dead_letter", seq=letter.get("seq"), reason=letter.get("reason"),
          detail=letter.get("detail"), attempts=letter.get("attempts"), kind=header.get("kind"),
          frames=len(frames), size=sum(len(frame) for frame in frames), at=letter.get("at"))


@hookimpl
def meshd_peer_state(peer: dict[str, Any], new: str) -> None:
    """Another daemon went online, stale or offline. It takes only the arguments it needs: pluggy
    passes hook arguments by name, so leaving out ``old`` is fine."""
    _emit("meshd_peer_state", node=peer.get("node"), name=peer.get("name"), router=peer.get("router"),
          new=new, at=time.time())


@hookimpl
def meshd_agent_state(agent: dict[str, Any], old: str, new: str) -> None:
    """An agent of this daemon changed state; ``old`` is ``"absent"`` for a new agent and
    ``new`` is ``"absent"`` for one that left the directory."""
    _emit("meshd_agent_state", agent=agent.get("name"), node=agent.get("node"),
          capabilities=agent.get("capabilities"), old=old, new=new, at=time.time())
