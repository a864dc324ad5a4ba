"""Contracts on the wire: schema versions, the contract record, and a small JSON Schema checker.

A typed topic's contract (docs/contracts.md, docs/PROTOCOL.md §17) travels as a plain map so that
a client in any language can advertise and check it: ``topic``, ``version`` ("MAJOR.MINOR"),
``description``, ``accepts`` and ``returns`` (JSON Schemas), ``examples``. Every message may carry
the version it was written for in the header key ``sv``. This module is pure (no sockets, no
pydantic): the daemon range-checks records and versions at its edge with it, the gateway and the
client check payloads against an advertised schema with :func:`schema_errors`.

The checker covers the part of JSON Schema that pydantic's ``model_json_schema`` and hand-written
contracts use: ``type`` (one or a list), ``properties``, ``required``, ``additionalProperties``
(false or a schema), ``items``, ``enum``, ``const``, ``anyOf``/``oneOf``/``allOf``, ``$ref`` to
``#/$defs/...`` (and ``#/definitions/...``), ``minimum``/``maximum`` (and the exclusive ones),
``minLength``/``maxLength``, ``minItems``/``maxItems``. Keywords it does not know are ignored
(the receiver's own validation stays the authority), so it never refuses what the receiver takes
unless the schema says so.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any, Final

from meshd.wire import protocol as P

__all__ = [
    "CONTRACT_KEYS",
    "MAX_VERSION_LEN",
    "SCHEMA_VERSION",
    "check_records",
    "contracts_digest",
    "format_version",
    "parse_version",
    "schema_errors",
]

SCHEMA_VERSION: Final = P.SCHEMA_VERSION
"""Header key: the contract version a message was written for ("MAJOR.MINOR")."""
MAX_VERSION_LEN: Final = 11
MAX_PART: Final = P.MAX_VERSION_PART
CONTRACT_KEYS: Final = frozenset({"topic", "version", "description", "accepts", "returns", "examples"})
MAX_DESCRIPTION: Final = 4096
MAX_EXAMPLES: Final = 8
MAX_CONTRACTS: Final = 256
"""Typed topics (all versions) one agent may advertise."""
_MAX_DEPTH: Final = 32


def parse_version(value: Any) -> tuple[int, int] | None:
    """``"1.2"`` -> ``(1, 2)``; None for anything else (not a string, a part past 65535, "1")."""
    return P.schema_version(value)


def format_version(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def contracts_digest(records: list[dict[str, Any]]) -> str:
    """A short digest of an agent's contract records: what a record change carries instead of them.
    It detects a change, it authenticates nothing (zlib's, so the daemon maps no OpenSSL)."""
    data = P.pack(records)
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}"


def check_records(records: Any) -> str | None:
    """Why ``records`` (a register body's ``contracts``) is not a list of contract records, or
    None. Checks shapes and ranges only; the size bound is the daemon's (``contracts_max_bytes``)."""
    if not isinstance(records, list):
        return "contracts must be a list of contract maps"
    if len(records) > MAX_CONTRACTS:
        return f"{len(records)} contracts; at most {MAX_CONTRACTS} per agent"
    seen: set[tuple[str, int]] = set()
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            return f"contracts[{i}] must be a map"
        extra = set(rec) - CONTRACT_KEYS
        if extra:
            return f"contracts[{i}] has unknown keys {sorted(map(str, extra))[:5]}"
        if not P.valid_topic(rec.get("topic")):
            return f"contracts[{i}].topic must be a topic (1-256 printable characters)"
        version = parse_version(rec.get("version"))
        if version is None:
            return f"contracts[{i}].version must be 'MAJOR.MINOR' (each 0..{MAX_PART})"
        key = (rec["topic"], version[0])
        if key in seen:
            return f"contracts[{i}]: topic {rec['topic']!r} has two contracts of major {version[0]}"
        seen.add(key)
        desc = rec.get("description", "")
        if not isinstance(desc, str) or len(desc) > MAX_DESCRIPTION:
            return f"contracts[{i}].description must be a string of at most {MAX_DESCRIPTION} characters"
        for key_name in ("accepts", "returns"):
            schema = rec.get(key_name)
            if schema is not None and not isinstance(schema, dict):
                return f"contracts[{i}].{key_name} must be a JSON Schema (a map) or absent"
        examples = rec.get("examples", [])
        if not isinstance(examples, list) or len(examples) > MAX_EXAMPLES:
            return f"contracts[{i}].examples must be a list of at most {MAX_EXAMPLES} payloads"
    return None


# ------------------------------------------------------------------------------ the checker

_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "object": (dict,), "array": (list, tuple), "string": (str,), "boolean": (bool,),
    "integer": (int,), "number": (int, float), "null": (type(None),),
}


def _is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number") and isinstance(value, bool):
        return False
    if name == "integer" and isinstance(value, float):
        return value.is_integer()
    kinds = _TYPES.get(name)
    return True if kinds is None else isinstance(value, kinds)


def _resolve(root: Mapping[str, Any], ref: Any) -> Mapping[str, Any] | None:
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return None
    node: Any = root
    for part in ref[2:].split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node if isinstance(node, Mapping) else None


def _path(path: tuple[str | int, ...]) -> str:
    return ".".join(str(p) for p in path) or "(payload)"


def schema_errors(schema: Mapping[str, Any], value: Any, limit: int = 5) -> list[tuple[str, str]]:
    """What is wrong with ``value`` against ``schema``: (field path, message) pairs, at most
    ``limit``; [] when it conforms (as far as the keywords above go)."""
    errors: list[tuple[str, str]] = []
    _check(schema, schema, value, (), errors, limit, 0)
    return errors[:limit]


def _check(root: Mapping[str, Any], schema: Any, value: Any, path: tuple[str | int, ...],
           errors: list[tuple[str, str]], limit: int, depth: int) -> None:
    if len(errors) >= limit or not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return
    if "$ref" in schema:
        target = _resolve(root, schema["$ref"])
        if target is not None:
            _check(root, target, value, path, errors, limit, depth + 1)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and \
                not any(not schema_errors_at(root, opt, value, depth) for opt in options):
            errors.append((_path(path), f"matches none of the {len(options)} allowed shapes"))
            return
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        for sub in all_of:
            _check(root, sub, value, path, errors, limit, depth + 1)
    if "const" in schema and value != schema["const"]:
        errors.append((_path(path), f"must be {schema['const']!r}"))
        return
    enum = schema.get("enum")
    if isinstance(enum, list) and value not in enum:
        errors.append((_path(path), f"must be one of {enum[:10]!r}"))
        return
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if kinds is not None and not any(_is_type(value, str(k)) for k in kinds):
        errors.append((_path(path), f"must be of type {'/'.join(map(str, kinds))}, not "
                                    f"{type(value).__name__}"))
        return
    if isinstance(value, dict):
        _check_object(root, schema, value, path, errors, limit, depth)
    elif isinstance(value, (list, tuple)):
        _check_array(root, schema, value, path, errors, limit, depth)
    elif isinstance(value, str):
        n = len(value)
        if isinstance(schema.get("minLength"), int) and n < schema["minLength"]:
            errors.append((_path(path), f"must have at least {schema['minLength']} characters"))
        if isinstance(schema.get("maxLength"), int) and n > schema["maxLength"]:
            errors.append((_path(path), f"must have at most {schema['maxLength']} characters"))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(schema, value, path, errors)


def schema_errors_at(root: Mapping[str, Any], schema: Any, value: Any, depth: int) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    _check(root, schema, value, (), errors, 1, depth + 1)
    return errors


def _check_object(root: Mapping[str, Any], schema: Mapping[str, Any], value: dict[Any, Any],
                  path: tuple[str | int, ...], errors: list[tuple[str, str]], limit: int,
                  depth: int) -> None:
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = schema.get("required")
    if isinstance(required, list):
        for name in required:
            if name not in value:
                errors.append((_path((*path, str(name))), "field required"))
    for name, item in value.items():
        if name in props:
            _check(root, props[name], item, (*path, str(name)), errors, limit, depth + 1)
            continue
        extra = schema.get("additionalProperties")
        if extra is False:
            errors.append((_path((*path, str(name))), "extra field not allowed"))
        elif isinstance(extra, Mapping):
            _check(root, extra, item, (*path, str(name)), errors, limit, depth + 1)


def _check_array(root: Mapping[str, Any], schema: Mapping[str, Any], value: list[Any] | tuple[Any, ...],
                 path: tuple[str | int, ...], errors: list[tuple[str, str]], limit: int,
                 depth: int) -> None:
    if isinstance(schema.get("minItems"), int) and len(value) < schema["minItems"]:
        errors.append((_path(path), f"must have at least {schema['minItems']} items"))
    if isinstance(schema.get("maxItems"), int) and len(value) > schema["maxItems"]:
        errors.append((_path(path), f"must have at most {schema['maxItems']} items"))
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            _check(root, items, item, (*path, i), errors, limit, depth + 1)
            if len(errors) >= limit:
                return


def _check_number(schema: Mapping[str, Any], value: float, path: tuple[str | int, ...],
                  errors: list[tuple[str, str]]) -> None:
    for key, text in (("minimum", "at least"), ("maximum", "at most"),
                      ("exclusiveMinimum", "more than"), ("exclusiveMaximum", "less than")):
        bound = schema.get(key)
        if not isinstance(bound, (int, float)) or isinstance(bound, bool):
            continue
        bad = {"minimum": value < bound, "maximum": value > bound,
               "exclusiveMinimum": value <= bound, "exclusiveMaximum": value >= bound}[key]
        if bad:
            errors.append((_path(path), f"must be {text} {bound}"))
