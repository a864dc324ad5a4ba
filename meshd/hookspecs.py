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
* syscall tools (:func:`meshd_tools`, :func:`meshd_approve_tool`, :func:`meshd_authorize`):
  called in the node's event loop by the system agent (meshd/tools/); :func:`meshd_tool_event` is
  an observer like the others. docs/tools.md describes the tools and the call path.
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
    "meshd_approve_tool",
    "meshd_authorize",
    "meshd_collaboration",
    "meshd_dead_letter",
    "meshd_peer_state",
    "meshd_shutdown",
    "meshd_startup",
    "meshd_tool_event",
    "meshd_tools",
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


# -- syscall tools (issue 9, "tools" block) ------------------------------------------------------


@hookspec
def meshd_tools() -> list[Any] | None:
    """Contribute syscall tools: LLM-callable tools the daemon's system agent serves.

    Each item is a :class:`meshd.tools.Tool` (name, description, pydantic argument model, async
    ``handler(args, ctx)``, ``side_effects``). The built-in tools come through this hook too. A
    tool name contributed twice (by two plugins, or a plugin and the built-ins) stops the daemon
    at start-up with an error naming both plugins.

    Returns a list of tools, or None.

    Called once per plugin when the daemon starts its system agent, in the node's event loop; a
    plugin that raises here is logged and counted, and its tools are left out.
    """


@hookspec(firstresult=True)
def meshd_approve_tool(call: dict[str, Any]) -> Any:
    """Decide whether a tool call with side effects may run.

    :param call: A plain dict: ``tool`` (name), ``caller`` (agent name), ``args`` (the validated
        arguments as a dict) and ``node`` (this daemon's node id).

    Returns ``"allow"``, ``"deny"``, ``"deny: <reason>"`` or ``"hold"`` (wait for a person:
    ``meshctl approvals allow|deny ID``), or None to leave it to the config's policy (``[tools]``
    ``approval`` per tool, else ``default_approval``). May return an awaitable of the same.
    Anything else, an exception or a timeout denies the call.

    Called in the node's event loop before the handler runs, with the hook timeout; stops at the
    first non-None result.
    """


@hookspec(firstresult=True)
def meshd_authorize(action: str, subject: str, target: str, topic: str | None) -> Any:
    """Decide who may call which tool, message whom on which topic, and decide which approvals.

    :param action: ``"tool"`` (``subject`` calls tool ``target``), ``"message"`` (``subject``
        sends to agent ``target`` on ``topic``; ``target`` is ``"*"`` for a publication) or
        ``"approve"`` (``subject`` decides the held call whose id is ``target``).
    :param subject: The acting agent's name.
    :param target: The tool name, agent name or approval id.
    :param topic: The topic for ``"message"``, else None.

    Returns None or True (allowed), False (refused) or a string (refused, the string says why).
    A refusal reaches the caller as ``FORBIDDEN`` and observers as a ``forbidden`` tool event.
    Answers are cached for a few seconds; keep it a quick, pure function (it must not block).

    Called synchronously in the node's event loop; stops at the first non-None result. An
    exception refuses.
    """


@hookspec
def meshd_tool_event(event: dict[str, Any]) -> Awaitable[None] | None:
    """A tool call was refused, held, decided or finished.

    :param event: A plain dict: ``event`` (``"called"``, ``"failed"``, ``"forbidden"``,
        ``"quota_exceeded"``, ``"held"``, ``"allowed"``, ``"denied"``), ``tool``, ``caller``,
        ``node`` (node id), ``at`` (unix time), and ``error`` (code) or ``reason`` where one
        applies, ``approval_id`` for held calls, ``ms`` (handler time) for ``called``/``failed``.

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on the plugin worker thread, off the routing path; exceptions and
    timeouts are logged and counted.
    """
