"""docs/tools.md must describe the tools the code serves: fail when a built-in tool, one of its
arguments, a [tools] setting or a tool error code is missing from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshd.config.settings import ToolsSettings
from meshd.tools.builtin import builtin_tools

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "tools.md"
TOOLS = {t.name: t for t in builtin_tools()}


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC_PATH.read_text(encoding="utf-8")


def _section(doc: str, name: str) -> str:
    match = re.search(rf"^### {re.escape(name)}\n(.*?)(?=^##)", doc, re.MULTILINE | re.DOTALL)
    assert match, f"docs/tools.md has no '### {name}' section"
    return match.group(1)


@pytest.mark.parametrize("name", sorted(TOOLS))
def test_tool_section(doc: str, name: str) -> None:
    body = _section(doc, name)
    for arg in TOOLS[name].input_schema()["properties"]:
        assert f"`{arg}`" in body, f"'### {name}' does not describe argument {arg!r}"
    assert ("Side effects" in body) == TOOLS[name].side_effects
    assert "**Errors**" in body and "**Returns**" in body


def test_no_section_for_unknown_tool(doc: str) -> None:
    start = doc.index("## Built-in tools")
    end = doc.index("\n## ", start + 1)
    documented = set(re.findall(r"^### (\w+)$", doc[start:end], re.MULTILINE))
    assert documented == set(TOOLS)


def test_settings_and_codes(doc: str) -> None:
    for key in ToolsSettings.model_fields:
        assert re.search(rf"^{key} = ", doc, re.MULTILINE), f"[tools] {key} is not documented"
    for code in ("FORBIDDEN", "NO_SUCH_TOOL", "QUOTA_EXCEEDED", "VALIDATION_FAILED", "APPROVAL_DENIED",
                 "QUEUE_FULL", "NOT_WIRED"):
        assert f"`{code}`" in doc
