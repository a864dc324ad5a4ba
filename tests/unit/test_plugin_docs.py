"""docs/plugins.md and the hookspec docstrings must describe every hook: fail when they drift apart.

Hooks are read from meshd.hookspecs (every function carrying the ``meshd`` hookspec marker), so a
new hook without a ``## <name>`` section in the docs, or without a ``:param`` line for each of its
arguments, fails here; so does a section for a hook that no longer exists.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from meshd import hookspecs

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def _hookspecs() -> dict[str, Callable[..., Any]]:
    marker = f"{hookspecs.PROJECT}_spec"  # the attribute pluggy's HookspecMarker sets
    return {name: func for name, func in vars(hookspecs).items()
            if callable(func) and hasattr(func, marker)}


HOOKS = _hookspecs()


@pytest.fixture(scope="module")
def doc() -> str:
    assert DOC_PATH.is_file(), f"{DOC_PATH} is missing"
    return DOC_PATH.read_text(encoding="utf-8")


def _sections(doc: str) -> dict[str, str]:
    """``## meshd_*`` heading -> the text up to the next heading of level 1 or 2."""
    parts = re.split(r"^(#{1,2} .*)$", doc, flags=re.MULTILINE)
    out: dict[str, str] = {}
    for heading, body in zip(parts[1::2], parts[2::2], strict=True):
        match = re.fullmatch(r"## (meshd_\w+)\s*", heading)
        if match:
            out[match.group(1)] = body
    return out


def test_hookspecs_found() -> None:
    assert {"meshd_startup", "meshd_shutdown", "meshd_dead_letter", "meshd_collaboration",
            "meshd_peer_state", "meshd_agent_state"} <= set(HOOKS)


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_has_doc_section(doc: str, name: str) -> None:
    sections = _sections(doc)
    assert name in sections, f"docs/plugins.md has no '## {name}' section"
    body = sections[name]
    assert f"def {name}(" in body, f"the '## {name}' section shows no signature"
    for arg in inspect.signature(HOOKS[name]).parameters:
        assert f"`{arg}`" in body, f"the '## {name}' section does not describe argument {arg!r}"


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_hook_docstring(name: str) -> None:
    doc = inspect.getdoc(HOOKS[name])
    assert doc, f"{name} has no docstring"
    for arg in inspect.signature(HOOKS[name]).parameters:
        assert re.search(rf"^:param {arg}:", doc, re.MULTILINE), f"{name}'s docstring lacks ':param {arg}:'"
    assert "Returns" in doc, f"{name}'s docstring does not say what is returned"
    last_paragraph = doc.strip().rsplit("\n\n", 1)[-1]
    assert last_paragraph.startswith("Called "), f"{name}'s docstring must end with how it is called"


def test_no_section_for_unknown_hook(doc: str) -> None:
    stale = set(_sections(doc)) - set(HOOKS)
    assert not stale, f"docs/plugins.md documents hooks that do not exist: {sorted(stale)}"
