"""Typed handlers: one topic, one contract per major version, validated before the handler runs.

Owns: :class:`Contract` (a topic at one version: the model it accepts, the one it returns, a
description, examples; its wire record, docs/PROTOCOL.md §17), :class:`TypedTopic` (the handler the
dispatcher runs for a typed topic: it picks the contract by the message's ``sv``, validates the
payload, runs the user's handler with the model instance, checks and dumps the reply), the
refusal it raises (:class:`ContractRefused`) and :func:`to_wire` (a model instance as plain data).

Models are duck-typed, so the agent library never imports pydantic (the import-linter contract in
pyproject.toml keeps an agent's idle memory low): a model class is anything with
``model_validate`` and ``model_json_schema``, an instance anything with ``model_dump``. pydantic's
``ValidationError`` is a ``ValueError`` with ``errors()``, which names the field.

Must not touch: the socket, the handler table beyond its own topic, the daemon.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from meshd.errors import HandlerError, MeshError, SchemaVersionUnsupported, ValidationFailed
from meshd.wire.contracts import format_version, parse_version, schema_errors

__all__ = ["Contract", "ContractRefused", "TypedTopic", "is_model_class", "to_wire"]

_PLAIN = frozenset({dict, list, tuple, str, int, float, bool, bytes, type(None)})


def is_model_class(obj: Any) -> bool:
    """Does ``obj`` look like a pydantic model class (``model_validate``, ``model_json_schema``)?"""
    return isinstance(obj, type) and callable(getattr(obj, "model_validate", None)) and \
        callable(getattr(obj, "model_json_schema", None))


def to_wire(value: Any) -> Any:
    """A model instance as JSON-shaped data (``model_dump(mode="json")``); anything else as it is."""
    if type(value) in _PLAIN:
        return value
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return value


class ContractRefused(Exception):
    """Raised by a :class:`TypedTopic` before the user's handler ran: the payload or its version
    was refused. The dispatcher answers with ``error`` (its code, message and details)."""

    def __init__(self, error: MeshError) -> None:
        super().__init__(error.message)
        self.error = error


def _first_error(exc: Exception) -> tuple[str, str]:
    """(field path, message) of a validation error: pydantic's ``errors()`` if it has one."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            items = errors()
        except Exception:
            items = None
        if isinstance(items, list) and items and isinstance(items[0], dict):
            loc = items[0].get("loc") or ()
            where = ".".join(str(p) for p in loc) if isinstance(loc, (list, tuple)) else str(loc)
            return where or "(payload)", str(items[0].get("msg", exc))
    return "(payload)", str(exc)


@dataclass
class Contract:
    """One typed topic at one version. ``accepts``/``returns``: a model class, a JSON Schema
    (a map: checked with meshd.wire.contracts' subset checker, the payload stays a dict), or None."""

    topic: str
    version: tuple[int, int]
    handler: Callable[[Any], Any]
    accepts: Any = None
    returns: Any = None
    description: str = ""
    examples: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        model = self.accepts
        # pydantic's core validator when there is one (what model_validate calls, ~0.3 us less
        # per message); else the duck-typed model_validate.
        core = getattr(model, "__pydantic_validator__", None) if model is not None else None
        validate = getattr(core, "validate_python", None)
        self._validate: Callable[[Any], Any] | None = (
            validate if callable(validate) else None if model is None or isinstance(model, dict)
            else model.model_validate)

    @property
    def version_text(self) -> str:
        return format_version(self.version)

    def record(self) -> dict[str, Any]:
        """The contract record that travels with the registration (docs/PROTOCOL.md §17)."""
        rec: dict[str, Any] = {"topic": self.topic, "version": self.version_text}
        if self.description:
            rec["description"] = self.description
        for key, model in (("accepts", self.accepts), ("returns", self.returns)):
            if isinstance(model, dict):
                rec[key] = model
            elif model is not None:
                rec[key] = model.model_json_schema()
        if self.examples:
            rec["examples"] = [to_wire(e) for e in self.examples]
        return rec

    def _refused(self, where: str, text: str) -> ContractRefused:
        version = self.version_text
        err = ValidationFailed(f"{self.topic} v{version}: field {where!r}: {text}")
        err.details = {"field": where, "topic": self.topic, "version": version}
        return ContractRefused(err)

    def accept(self, payload: Any) -> Any:
        """The payload as the handler gets it (a model instance); raises ContractRefused."""
        validate = self._validate
        if validate is not None:
            try:
                return validate(payload)
            except ValueError as exc:  # pydantic's ValidationError is one
                raise self._refused(*_first_error(exc)) from None
        model = self.accepts
        if isinstance(model, dict):
            problems = schema_errors(model, payload, 1)
            if problems:
                raise self._refused(*problems[0])
        return payload

    def answer(self, value: Any) -> Any:
        """The handler's return value checked against ``returns`` and made plain data. A mismatch
        is the handler's bug, not the requester's: HandlerError."""
        model = self.returns
        if model is None:
            return to_wire(value)
        try:
            if isinstance(model, dict):
                data = to_wire(value)
                problems = schema_errors(model, data, 1)
                if problems:
                    raise ValueError(f"field {problems[0][0]!r}: {problems[0][1]}")
                return data
            if not isinstance(value, model):
                value = model.model_validate(to_wire(value))
            return value.model_dump(mode="json")
        except ValueError as exc:
            where, text = _first_error(exc) if callable(getattr(exc, "errors", None)) else ("", str(exc))
            detail = f"field {where!r}: {text}" if where else text
            raise HandlerError(f"the reply of {self.topic} v{self.version_text} does not match its "
                               f"returns: {detail}") from None


class TypedTopic:
    """The handler of one typed topic: a contract per major version, side by side."""

    def __init__(self, topic: str, defer: Any) -> None:
        """``defer``: the value a request handler returns to answer later (``meshd.DEFER``)."""
        self.topic = topic
        self.majors: dict[int, Contract] = {}
        self._oldest: Contract | None = None
        self._defer = defer

    def add(self, contract: Contract) -> None:
        self.majors[contract.version[0]] = contract
        self._oldest = self.majors[min(self.majors)]

    @property
    def supported(self) -> list[str]:
        return [self.majors[m].version_text for m in sorted(self.majors)]

    def pick(self, version: Any) -> Contract:
        """The contract for a message's ``sv``: its major, or the oldest served when it has none."""
        if version is None and self._oldest is not None:
            return self._oldest
        parsed = parse_version(version)
        contract = self.majors.get(parsed[0]) if parsed is not None else None
        if contract is None:
            supported = self.supported
            err = SchemaVersionUnsupported(
                f"{self.topic}: version {version!r} is not served; supported: {', '.join(supported)}")
            err.details = {"topic": self.topic, "version": str(version)[:16], "supported": supported}
            raise ContractRefused(err)
        return contract

    def __call__(self, msg: Any) -> Any:
        contract = self.pick(msg.schema_version)
        msg.payload = contract.accept(msg.payload)
        result = contract.handler(msg)
        if not msg.is_request:
            return result  # a send's or publication's result is no reply: nothing to check
        if inspect.isawaitable(result):
            return self._finish(contract, result, msg.is_request)
        return self._answer(contract, result, msg.is_request)

    def _answer(self, contract: Contract, value: Any, is_request: bool) -> Any:
        if not is_request or value is self._defer:
            return value
        return contract.answer(value)

    async def _finish(self, contract: Contract, result: Awaitable[Any], is_request: bool) -> Any:
        return self._answer(contract, await result, is_request)
