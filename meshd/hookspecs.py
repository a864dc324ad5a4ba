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

* configuration (:func:`meshd_plugin_config`, :func:`meshd_configure`): called once at start-up,
  before anything else, with the plugin's own ``[plugins.NAME]`` config section validated.
* lifecycle (:func:`meshd_startup`, :func:`meshd_shutdown`): called in the node's event loop, one
  plugin at a time; an awaitable result is awaited with the host's hook timeout. ``meshd_startup``
  comes before the plugin's first observer call, ``meshd_shutdown`` after its last.
* observers and sinks (:func:`meshd_dead_letter`, :func:`meshd_collaboration`,
  :func:`meshd_peer_state`, :func:`meshd_agent_state`): queued by the routing loop on the plugin's
  own bounded queue and called by its own worker (a thread, or a child process with
  ``isolation = "process"``); when its queue is full the event is dropped and counted for it.
  They get plain copies of the data and their results are ignored (an awaitable result is
  awaited, with the timeout, in the worker's own event loop).

In process mode every hook runs in the plugin's child process, and ``node`` is a
:class:`meshd.plugins.process.NodeSnapshot` (the node as it was when the child started).
  :func:`meshd_peer_state`, :func:`meshd_agent_state`): queued by the routing loop on a bounded
  queue and called on the plugin worker thread; when the queue is full the event is dropped and
  counted. They get plain copies of the data and their results are ignored (an awaitable result is
  awaited, with the timeout, in the worker thread's own event loop).
* syscall tools (:func:`meshd_tools`, :func:`meshd_approve_tool`, :func:`meshd_authorize`):
  called in the node's event loop by the system agent (meshd/tools/); :func:`meshd_tool_event` is
  an observer like the others. docs/tools.md describes the tools and the call path.
* content routing (:func:`meshd_route`, :func:`meshd_route_payload`): decisions, called
  synchronously on the routing path of the sender's daemon for messages to a ``route:`` address.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import pluggy

from meshd.view import NodeView

if TYPE_CHECKING:  # annotations only: a daemon whose plugins declare no settings never imports pydantic
    from pydantic import BaseModel

__all__ = [
    "PROJECT",
    "hookimpl",
    "hookspec",
    "meshd_agent_state",
    "meshd_approve_tool",
    "meshd_authorize",
    "meshd_collaboration",
    "meshd_configure",
    "meshd_dead_letter",
    "meshd_peer_state",
    "meshd_plugin_config",
    "meshd_route",
    "meshd_route_payload",
    "meshd_shutdown",
    "meshd_startup",
    "meshd_tool_event",
    "meshd_tools",
]

#: The pluggy project name, and the entry-point group plugins register under.
PROJECT = "meshd"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- configuration ------------------------------------------------------------------------------


@hookspec
def meshd_plugin_config() -> type[BaseModel] | None:
    """Declare this plugin's settings: return the pydantic model its ``[plugins.NAME]`` section is
    validated with (NAME is the plugin's name: its entry-point or module name).

    The section's keys ``isolation`` and ``queue_size`` are the host's and never reach the model. A
    value the model refuses, or a missing required key, stops the daemon at start-up with a config
    error naming ``plugins.NAME.KEY`` (exit status 2). A plugin without this hook may have a section
    holding only the host's keys.

    Returns the model class (not an instance), or None for no settings.

    Called once per plugin while the daemon loads plugins, before any other hook, in the thread
    that loads them (and again in the child in process mode); an exception makes the plugin a load
    failure.
    """


@hookspec
def meshd_configure(config: BaseModel) -> None:
    """Receive this plugin's validated settings (an instance of the model
    :func:`meshd_plugin_config` returned, defaults filled in).

    :param config: The validated settings.

    Returns None.

    Called once per plugin that declares settings, right after loading and before
    :func:`meshd_startup` (in process mode: in the child, each time it starts); exceptions are
    logged and counted.
    """


# -- lifecycle ----------------------------------------------------------------------------------


@hookspec
def meshd_startup(node: NodeView) -> Awaitable[None] | None:
    """The node has started: its sockets are bound, discovery runs, and it routes messages.

    Use it to open connections, start background tasks in the node's loop, or read the node
    through its :class:`meshd.view.NodeView` members (``node_id``, ``name``, ``mesh``,
    ``metrics_snapshot()``, ``info()``, ``agents()``, ``peers()``). Do not keep the loop busy: the
    routing path runs in the same loop. No observer hook of this plugin is called before this one
    returned.

    :param node: The running node, as a :class:`meshd.view.NodeView`.

    Returns None, or an awaitable that the host awaits (with the hook timeout) before it calls the
    next plugin.

    Called for every plugin, in the node's event loop, one plugin at a time; exceptions and
    timeouts are logged and counted.
    """


@hookspec
def meshd_shutdown(node: NodeView) -> Awaitable[None] | None:
    """The node is stopping: flush and close what :func:`meshd_startup` opened.

    Plugins are called in the reverse of the start-up order. It is the last call a plugin gets:
    the host first stops taking events and lets each plugin's worker deliver what its queue holds
    (for at most the hook timeout); events after that point are dropped and counted.

    :param node: The node that is stopping, as a :class:`meshd.view.NodeView`.

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
    all of them (the built-in :class:`meshd.plugins.builtin.JsonlDeadLetterSink` is one).

    :param letter: A plain dict: ``seq`` (int, per node), ``at`` (unix time), ``reason`` (an error
        code such as ``"PEER_UNREACHABLE"``, or ``"malformed:<why>"``), ``detail`` (str),
        ``attempts`` (int, delivery attempts made), ``header`` (the decoded header dict, or None
        when it did not decode) and ``frames`` (list of bytes: signature, header, payload...).

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on its own worker (thread or child process), off the routing path;
    exceptions and timeouts are logged and counted.
    """


# -- observers ----------------------------------------------------------------------------------


@hookspec
def meshd_collaboration(outcome: dict[str, Any]) -> Awaitable[None] | None:
    """An agent-to-agent interaction finished, or was handed on: one call per send, request,
    delegate and handoff (never for publish/broadcast), on the initiator's daemon only.

    :param outcome: A plain dict: ``kind`` (``"send"``, ``"request"``, ``"delegate"`` or
        ``"handoff"``), ``id`` (message id), ``initiator`` and ``target`` (agent names),
        ``topic`` (str or None), ``outcome`` (``"sent"``, ``"ok"``, ``"error"``, ``"accepted"``,
        ``"rejected"`` or ``"delivered"``), ``error_code`` (str or None), ``latency_ms`` (float,
        or None where there is no reply to time), ``qos`` (0 or 1) and ``at`` (unix time).

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on its own worker (thread or child process), off the routing path;
    exceptions and timeouts are logged and counted.
    """


@hookspec
def meshd_peer_state(peer: dict[str, Any], old: str, new: str) -> Awaitable[None] | None:
    """Another daemon of the mesh changed liveness state, as this daemon sees it.

    :param peer: A plain dict: ``node`` (node id), ``name`` (node name), ``state`` (the new state)
        and ``router`` (the endpoint used to reach it, or ``""``).
    :param old: The previous state: ``"online"``, ``"one-way"`` (we hear it but it does not
        confirm hearing us), ``"stale"`` or ``"offline"`` (``"offline"`` for a peer seen for the
        first time).
    :param new: The new state, one of the same.

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on its own worker (thread or child process), off the routing path;
    exceptions and timeouts are logged and counted.
    """


@hookspec
def meshd_agent_state(agent: dict[str, Any], old: str, new: str) -> Awaitable[None] | None:
    """An agent attached to this daemon registered, went stale, came back, or left (it fires only
    on the agent's own daemon, never for agents of other daemons).

    :param agent: A plain dict: ``name`` (agent name), ``node`` (node id of its daemon: this one)
        and ``capabilities`` (list of str).
    :param old: The previous state: ``"absent"`` (not known before), ``"online"`` or ``"stale"``.
    :param new: The new state, one of the same (``"absent"`` once it is gone from the directory).

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on its own worker (thread or child process), off the routing path;
    exceptions and timeouts are logged and counted.
    """


# -- tasks and spawning ----------------------------------------------------------------------------

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
    :class:`meshd.tools.spawn.Spawner`), or an object with ``async spawn(template, *, requester,
    name=None) -> dict``, ``list() -> list[dict]`` and ``async stop_all()``.

    Called once when the daemon's tools start, in the node's event loop; stops at the first
    non-None result. An exception stops the start-up with the plugin's name.
    """


# -- syscall tools ---------------------------------------------------------------------------------


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
    ``"message"`` is asked by tools and by the sender's daemon on the routing path, for every
    ``send``, ``request`` and ``publish`` of its local agents (not replies); a daemon where no
    plugin implements this hook never asks.

    Called synchronously in the node's event loop; stops at the first non-None result. An
    exception refuses.
    """


@hookspec(firstresult=True)
def meshd_route(route: str, message: dict[str, Any]) -> Any:
    """Choose where a message sent to the virtual address ``route:<route>`` goes (content routing).

    :param route: The route's name: what follows ``route:`` in the message's ``to``.
    :param message: A plain dict: ``kind`` (``send`` or ``request``), ``id``, ``from`` (the sending
        agent), ``topic``, ``headers`` (the application headers, a dict), ``qos``, ``priority``,
        and ``payload`` (decoded) only when ``meshd_route_payload`` answered True for this route.

    Returns the chosen agent's address (``name`` or ``name@node``), or None (no opinion: the next
    plugin is asked). When no plugin chooses, or the choice names no reachable agent, the sender
    gets ``NO_SUCH_AGENT`` naming the route. An exception or an awaitable counts as no choice
    (logged, counted). Asked by the sender's daemon for every message an agent of that node sends
    to a ``route:`` address (a qos-0 batch is asked per message; a qos-1 batch once, as a unit).

    Called synchronously in the node's event loop, on the routing path: keep it quick (read the
    directory you got from ``meshd_startup``'s ``node.agents()``; never block). A daemon where no
    plugin implements this hook never asks.
    """


@hookspec(firstresult=True)
def meshd_route_payload(route: str) -> Any:
    """Whether ``meshd_route`` needs the decoded payload for messages to ``route:<route>``.

    :param route: The route's name (what follows ``route:``).

    Returns True to get ``payload`` in ``meshd_route``'s message; None or False: headers only.
    Daemons otherwise never decode a payload: asking for it costs one msgpack decode (bounded by
    ``max_payload_bytes``) per routed message, on the routing path.

    Called synchronously in the node's event loop, once per route name (the answer is
    remembered); stops at the first non-None result. An exception counts as no.
    """


@hookspec
def meshd_tool_event(event: dict[str, Any]) -> Awaitable[None] | None:
    """A tool call was refused, held, decided or finished.

    :param event: A plain dict: ``event`` (``"called"``, ``"failed"``, ``"forbidden"``,
        ``"quota_exceeded"``, ``"held"``, ``"allowed"``, ``"denied"``), ``tool``, ``caller``,
        ``node`` (node id), ``at`` (unix time), and ``error`` (code) or ``reason`` where one
        applies, ``approval_id`` for held calls, ``ms`` (handler time) for ``called``/``failed``.
        An agent's own message refused on the routing path: ``event`` ``"forbidden"``,
        ``action`` ``"message"``, ``tool`` None, ``target`` (or ``"*"``) and ``topic``.

    Returns None, or an awaitable (awaited with the hook timeout); the result is ignored.

    Called for every plugin, on the plugin worker thread, off the routing path; exceptions and
    timeouts are logged and counted.
    """
