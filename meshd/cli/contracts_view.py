"""``meshctl describe AGENT``: an agent's contracts as people read them.

Owns the readable view of contract records (docs/contracts.md): each skill with its version and
description, the fields it accepts and returns (type, required, default, description), and an
example call. Pure: records in, lines out.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

__all__ = ["describe_lines", "skills_cell"]


def skills_cell(contracts: Any) -> str:
    """``verify@1.2,summarize@2.0``: the typed topics of an agent for a table cell."""
    if not isinstance(contracts, list):
        return ""
    return ",".join(f"{c.get('topic')}@{c.get('version')}" for c in contracts if isinstance(c, dict))


def _resolve(root: dict[str, Any], schema: Any) -> Any:
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else schema
    return schema


def _type_of(root: dict[str, Any], schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("$ref"), str):
        target = _resolve(root, schema)
        if not isinstance(target, dict):
            return "?"
        return str(target.get("title") or schema["$ref"].rsplit("/", 1)[-1])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(_type_of(root, s) for s in schema[key])
    kind = schema.get("type")
    if kind == "array":
        return f"list[{_type_of(root, schema.get('items'))}]"
    if isinstance(kind, list):
        return " | ".join(map(str, kind))
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"][:8])
    return str(kind) if kind else "any"


def _field_lines(schema: Any, indent: str) -> list[str]:
    if not isinstance(schema, dict):
        return [f"{indent}(anything)"]
    body = _resolve(schema, schema)
    props = body.get("properties") if isinstance(body, dict) else None
    if not isinstance(props, dict):
        return [f"{indent}{_type_of(schema, body)}"]
    required = set(body.get("required") or [])
    lines = []
    for name, prop in props.items():
        text = f"{indent}{name}: {_type_of(schema, prop)}"
        if name in required:
            text += " (required)"
        elif isinstance(prop, dict) and "default" in prop:
            text += f" = {json.dumps(prop['default'])}"
        desc = prop.get("description") if isinstance(prop, dict) else None
        if desc:
            text += f"  -- {desc}"
        lines.append(text)
    return lines


def describe_lines(agent: str, node: str | None, records: list[dict[str, Any]]) -> list[str]:
    """The readable view of ``agent``'s contract records."""
    out = [f"{agent}" + (f" (node {node})" if node else "")]
    if not records:
        out.append("  no contracts: its topics are untyped (any payload)")
        return out
    for rec in records:
        topic, version = rec.get("topic"), rec.get("version")
        head = f"  {topic} v{version}"
        if rec.get("description"):
            head += f": {rec['description']}"
        out.append(head)
        out.append("    accepts:")
        out += _field_lines(rec.get("accepts"), "      ")
        if rec.get("returns") is not None:
            out.append("    returns:")
            out += _field_lines(rec.get("returns"), "      ")
        examples = rec.get("examples") or []
        example = json.dumps(examples[0]) if examples else "{...}"
        out.append(f"    example: meshctl request {shlex.quote(agent)} {shlex.quote(str(topic))} "
                   f"{shlex.quote(example)} --version {version}")
    return out
