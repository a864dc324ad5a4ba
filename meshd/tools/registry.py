"""The tool registry: what a tool is, its JSON Schema in the shapes LLM APIs take, and validation.

Owns :class:`Tool` (name, description, pydantic argument model, async handler, side-effects flag),
:class:`ToolContext` (what a handler gets besides its arguments), :class:`ToolRegistry` (tools by
name; a name contributed twice is a start-up error naming both plugins) and the schema export
(OpenAI function, Anthropic tool, MCP tool). Must not touch sockets, the node or the policy:
approval, quotas and authorization live in :mod:`meshd.plugins.policy`, calling in
:mod:`meshd.tools.service`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from meshd.errors import ConfigError, NoSuchTool, ValidationFailed

if TYPE_CHECKING:
    from pydantic import BaseModel

    from meshd.client import Agent
    from meshd.config.settings import Settings

__all__ = ["SCHEMA_FORMATS", "Tool", "ToolContext", "ToolRegistry", "validate_args"]

#: The shapes ``schemas()`` can export.
SCHEMA_FORMATS: Final = ("openai", "anthropic", "mcp")

_TOOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


@dataclass(slots=True)
class ToolContext:
    """What a tool handler gets besides its validated arguments.

    ``caller`` is the agent that called the tool (as the daemon stamped it); ``agent`` is the
    daemon's system agent (a :class:`meshd.Agent`) through which the tool acts on the mesh;
    ``deadline`` is the caller's deadline on this host's ``time.monotonic()`` clock (its
    budget, counted from arrival; never a wall-clock time) or None. ``tasks`` and ``spawner`` are the
    daemon's task service and spawner, or None when not wired (a tool that needs them must raise
    :class:`meshd.errors.NotWired`). ``services`` holds anything else the daemon wires.
    ``progress(note)`` tells the caller that a long call is still going (a progress note on its
    request: MCP clients see it as a progress notification); None when nobody listens.
    """

    caller: str
    agent: Agent
    settings: Settings
    deadline: float | None = None
    tasks: Any = None
    spawner: Any = None
    services: dict[str, Any] = field(default_factory=dict)
    progress: Callable[[str], Awaitable[None]] | None = None
    #: The call's W3C trace headers (``traceparent``/``tracestate``): what it starts (a task, a
    #: request) goes on in the caller's trace.
    trace: dict[str, str] = field(default_factory=dict)

    async def note(self, text: str) -> None:
        """Send ``text`` as a progress note to the caller, if it listens (never raises)."""
        if self.progress is not None:
            await self.progress(text)

    def time_left(self, now: float) -> float | None:
        """Seconds until the caller's deadline (None if it set none); ``now`` is ``time.monotonic()``."""
        return None if self.deadline is None else self.deadline - now


Handler = Callable[[Any, ToolContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    """One LLM-callable tool.

    ``args`` is a pydantic model: its JSON Schema is the tool's input schema, and a call's
    arguments are validated against it before ``handler(args, ctx)`` runs. ``side_effects``: the
    call changes something (sends, spawns, creates), so it passes through the approval policy.
    ``plugin`` is filled in by the registry (which plugin contributed it).
    """

    name: str
    description: str
    args: type[BaseModel]
    handler: Handler
    side_effects: bool = False
    plugin: str = ""

    def __post_init__(self) -> None:
        if not _TOOL_NAME.fullmatch(str(self.name)):
            raise ValueError(f"invalid tool name {self.name!r}: a letter, then up to 63 of "
                             "letters, digits, '_' or '-'")
        from pydantic import BaseModel  # a tool's model is pydantic, so it is imported already

        if not issubclass(self.args, BaseModel):
            raise TypeError(f"tool {self.name!r}: args must be a pydantic model class")
        if not callable(self.handler):
            raise TypeError(f"tool {self.name!r}: handler must be an async callable")

    def input_schema(self) -> dict[str, Any]:
        """The JSON Schema of the arguments (an object schema; ``title`` left out)."""
        schema = self.args.model_json_schema()
        schema.pop("title", None)
        schema.setdefault("properties", {})
        schema.setdefault("type", "object")
        return schema

    def describe(self) -> dict[str, Any]:
        """A plain description: name, description, input_schema, side_effects, plugin."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema(),
                "side_effects": self.side_effects, "plugin": self.plugin}


def schema_as(description: dict[str, Any], fmt: str) -> dict[str, Any]:
    """One tool description (as :meth:`Tool.describe` makes it) in the shape an LLM API takes."""
    name, text, schema = description["name"], description["description"], description["input_schema"]
    if fmt == "openai":
        return {"type": "function", "function": {"name": name, "description": text, "parameters": schema}}
    if fmt == "anthropic":
        return {"name": name, "description": text, "input_schema": schema}
    if fmt == "mcp":
        return {"name": name, "description": text, "inputSchema": schema}
    raise ValidationFailed(f"unknown schema format {fmt!r}: one of {', '.join(SCHEMA_FORMATS)}")


def validate_args(tool: Tool, args: Any) -> BaseModel:
    """The arguments as the tool's model, or :class:`ValidationFailed` naming the first bad field."""
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValidationFailed(f"tool {tool.name!r}: arguments must be an object, not "
                               f"{type(args).__name__}")
    from pydantic import ValidationError

    try:
        return tool.args.model_validate(args)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        where = ".".join(str(part) for part in errors[0]["loc"]) if errors else ""
        where = where or "arguments"
        text = errors[0]["msg"] if errors else "invalid"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ValidationFailed(f"tool {tool.name!r}: field {where!r}: {text}{more}",
                               details={"field": where}) from None


class ToolRegistry:
    """Tools by name. Built-ins and plugins add theirs once, at start-up."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def add(self, tool: Tool, plugin: str) -> None:
        """Add ``tool`` as contributed by ``plugin``; a name already taken is a :class:`ConfigError`
        naming both plugins (the daemon does not start)."""
        if not isinstance(tool, Tool):
            raise ConfigError("tools", f"plugin {plugin!r} contributed {tool!r}, which is not a "
                              "meshd.tools.Tool")
        held = self._tools.get(tool.name)
        if held is not None:
            raise ConfigError("tools", f"tool {tool.name!r} is contributed by two plugins: "
                              f"{held.plugin!r} and {plugin!r}")
        self._tools[tool.name] = Tool(tool.name, tool.description, tool.args, tool.handler,
                                      tool.side_effects, plugin)

    def add_all(self, tools: Iterable[Tool], plugin: str) -> None:
        for tool in tools:
            self.add(tool, plugin)

    def get(self, name: Any) -> Tool:
        """The tool called ``name``, or :class:`NoSuchTool`."""
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            raise NoSuchTool(f"no tool named {name!r}; known: {', '.join(sorted(self._tools))}")
        return tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return sorted(self._tools)

    def describe(self) -> list[dict[str, Any]]:
        """Every tool's plain description, sorted by name."""
        return [self._tools[name].describe() for name in sorted(self._tools)]

    def schemas(self, fmt: str) -> list[dict[str, Any]]:
        """Every tool's schema in the shape ``fmt`` (``openai``, ``anthropic`` or ``mcp``) takes."""
        return [schema_as(d, fmt) for d in self.describe()]
