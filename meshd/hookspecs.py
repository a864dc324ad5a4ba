"""The hooks a meshd plugin can implement (pluggy project ``meshd``).

A plugin is a module or an object with functions named like the specs below, each marked with
:data:`hookimpl`::

    from meshd.hookspecs import hookimpl

    @hookimpl
    def meshd_collaboration(outcome):
        print(outcome["kind"], outcome["outcome"], outcome["latency_ms"])

An implementation may take any subset of a hook's arguments, by name. The core never calls these
through ``pm.hook`` directly: :class:`meshd.plugins.PluginHost` calls each implementation on its own,
so one plugin that raises or hangs never keeps the others from being called, and never stalls
routing. Every hook is documented, with the keys of its dicts and an example, in docs/plugins.md
(one section per hook; tests/unit/test_plugin_docs.py keeps the two in step).

Hook families:

* lifecycle (:func:`meshd_startup`, :func:`meshd_shutdown`): called in the node's event loop, one
  plugin at a time; an awaitable result is awaited with the host's hook timeout.
* observers and sinks (:func:`meshd_dead_letter`, :func:`meshd_collaboration`,
  :func:`meshd_peer_state`, :func:`meshd_agent_state`): queued by the routing loop on a bounded
  queue and called on the plugin worker thread; when the queue is full the event is dropped and
  counted. They get plain copies of the data and their results are ignored (an awaitable result is
  awaited, with the timeout, in the worker thread's own event loop).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import pluggy

__all__ = [
    "PROJECT",
    "hookimpl",
    "hookspec",
    "meshd_agent_state",
    "meshd_collaboration",
    "meshd_dead_letter",
    "meshd_peer_state",
    "meshd_shutdown",
    "meshd_startup",
]

#: The pluggy project name, and the entry-point group plugins register under.
PROJECT = "meshd"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- lifecycle ----------------------------------------------------------------------------------


@hookspec
def meshd_startup(node: Any) -> Awaitable[None] | None:
    """The node has started: its sockets are bound, discovery runs, and it routes messages.

    Use it to open connections, start background tasks in the node's loop, or read the node's
    identity (``node.node_id``, ``node.name``, ``node.settings``). Do not keep the loop busy: the
    routing path runs in the same loop.

    :param node: The running :class:`meshd.node.Node`.

    Returns None, or an awaitable that the host awaits (with the hook timeout) before it calls the
    next plugin.

    Called for every plugin, in the node's event loop, one plugin at a time; exceptions and
    timeouts are logged and counted.
    """


@hookspec
def meshd_shutdown(node: Any) -> Awaitable[None] | None:
    """The node is stopping: flush and close what :func:`meshd_startup` opened.

    Plugins are called in the reverse of the start-up order. Observer hooks of the same plugin may
    still be running on the plugin worker thread until the host is stopped.

    :param node: The :class:`meshd.node.Node` that is stopping.

    Returns None, or an awaitable that the host awaits (with the hook timeout) before it calls the
    next plugin.

    Called for every plugin, in the node's event loop, one plugin at a time; exceptions and
    timeouts are logged and counted.
    """


# -- dead-letter sinks --------------------------------------------------------------------------


@hookspec
def meshd_dead_letter(letter: dict[str, Any]) -> Awaitable[None] | None:
    """A message could not be delivered, or a frame set was malformed: store it somewhere durable.

    The node keeps only a bounded in-memory FIFO of dead letters; this hook is how a sink keeps
    all of them (the built-in :class:`meshd.builtin_plugins.JsonlDeadLetterSink` is one).

    :param letter: A plain dict: ``seq`` (int, per node), ``at`` (unix time), ``reason`` (an error
        code such as ``"PEER_UNREACHABLE"``, or ``"malformed:<why>"``), ``detail`` (str),
        ``attempts`` (int, delivery attempts made), ``header`` (the decoded header dict, or None
        when it did not decode) and ``frames`` (list of bytes: signature, header, payload...).

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on the plugin worker thread, off the routing path; exceptions and
    timeouts are logged and counted.
    """


# -- observers ----------------------------------------------------------------------------------


@hookspec
def meshd_collaboration(outcome: dict[str, Any]) -> Awaitable[None] | None:
    """An agent-to-agent interaction finished, or was handed on: one call per send, request,
    delegate and handoff (never for publish/broadcast).

    :param outcome: A plain dict: ``kind`` (``"send"``, ``"request"``, ``"delegate"`` or
        ``"handoff"``), ``id`` (message id), ``initiator`` and ``target`` (agent names),
        ``topic`` (str or None), ``outcome`` (``"sent"``, ``"ok"``, ``"error"``, ``"accepted"``,
        ``"rejected"`` or ``"delivered"``), ``error_code`` (str or None), ``latency_ms`` (float,
        or None where there is no reply to time), ``qos`` (0 or 1) and ``at`` (unix time).

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on the plugin worker thread, off the routing path; exceptions and
    timeouts are logged and counted.
    """


@hookspec
def meshd_peer_state(peer: dict[str, Any], old: str, new: str) -> Awaitable[None] | None:
    """Another daemon of the mesh changed liveness state.

    :param peer: A plain dict: ``node`` (node id), ``name`` (node name), ``state`` (the new state)
        and ``router`` (the endpoint used to reach it, or ``""``).
    :param old: The previous state: ``"online"``, ``"stale"`` or ``"offline"``.
    :param new: The new state, one of the same.

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on the plugin worker thread, off the routing path; exceptions and
    timeouts are logged and counted.
    """


@hookspec
def meshd_agent_state(agent: dict[str, Any], old: str, new: str) -> Awaitable[None] | None:
    """An agent anywhere in the mesh registered, went stale, came back, or left.

    :param agent: A plain dict: ``name`` (agent name), ``node`` (node id of its daemon) and
        ``capabilities`` (list of str).
    :param old: The previous state: ``"absent"`` (not known before), ``"online"``, ``"stale"`` or
        ``"offline"``.
    :param new: The new state, one of the same (``"absent"`` once it is gone from the directory).

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on the plugin worker thread, off the routing path; exceptions and
    timeouts are logged and counted.
    """


# -- tasks and spawning (issue 9, "tasks" block) --------------------------------------------------

__all__ += ["meshd_spawner", "meshd_task_event"]


@hookspec
def meshd_task_event(event: str, data: dict[str, Any]) -> Awaitable[None] | None:
    """A task, a plan or a spawned agent changed: created, assigned, done, failed, cancelled...

    :param event: ``"task.<what>"`` (``created``, ``assigned``, ``waiting``, ``retry``, ``done``,
        ``failed``, ``cancelled``), ``"plan.<what>"`` (``created``, ``round``, ``done``,
        ``failed``, ``cancelled``) or ``"spawn.<what>"`` (``started``, ``exited``, ``crashed``,
        ``restarted``, ``stopped``).
    :param data: A plain dict. For tasks: ``id``, ``title``, ``capability``, ``state``,
        ``assignee``, ``attempts``, ``error``, ``creator``, ``plan_id``, ``key``, ``round``,
        ``why`` and ``event``; ``task.failed`` adds ``dead_letter`` (True when the task itself
        failed, False when it failed because a dependency did). For plans: ``id``, ``creator``,
        ``state``, ``round``, ``rounds``, ``error``, ``tasks`` (count) and ``event``. For
        spawned agents: ``id``, ``name``, ``template``, ``requester``, ``state``, ``pid``,
        ``returncode``, ``restarts``, ``capabilities``, ``started_at``, ``log_lines``, ``event``.

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on the plugin worker thread, off the routing path; exceptions and
    timeouts are logged and counted.
    """


@hookspec(firstresult=True)
def meshd_spawner(settings: Any, socket_path: Any, emit: Any) -> Any:
    """Replace the built-in spawner (for example with containers or ``systemd-run``).

    :param settings: The daemon's :class:`meshd.config.Settings` (``settings.spawn.templates``
        are the only agents it may start).
    :param socket_path: The agent socket (a :class:`pathlib.Path`) the children attach to.
    :param emit: A function ``emit(event, data)`` for ``spawn.*`` events, or None.

    Returns None to leave the choice to the next plugin (and finally the built-in
    :class:`meshd.spawn.Spawner`), or an object with ``async spawn(template, *, requester,
    name=None) -> dict``, ``list() -> list[dict]`` and ``async stop_all()``.

    Called once when the daemon's tools start, in the node's event loop; stops at the first
    non-None result. An exception stops the start-up with the plugin's name.
    """
