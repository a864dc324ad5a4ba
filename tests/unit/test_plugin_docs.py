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


# -- the rest of docs/plugins.md, checked against the code -----------------------------------------

MESHD_DIR = Path(__file__).resolve().parents[2] / "meshd"


def _table(doc: str, heading: str) -> dict[str, list[str]]:
    """First column -> the other cells, for the first Markdown table after ``heading``."""
    start = doc.index(heading)
    rows: dict[str, list[str]] = {}
    for line in doc[start:].splitlines()[1:]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if set(cells[0]) <= {"-", " ", ":"} or cells[0] in {"member", "key", "counter", ""}:
                continue
            rows[cells[0].strip("`")] = cells[1:]
        elif rows:
            break
    return rows


def doc_files(doc: str) -> dict[str, str]:
    """The code blocks marked ``<!-- file: NAME -->`` in the docs, by file name."""
    return {m.group(1): m.group(2) for m in re.finditer(
        r"<!-- file: (\S+) -->\n```python\n(.*?)```", doc, flags=re.DOTALL)}


def test_counter_table_matches_the_counters_the_code_makes(doc: str) -> None:
    source = "\n".join(path.read_text() for path in (MESHD_DIR / "plugins").glob("*.py"))
    made = set()
    for m in re.finditer(r"count\(f?\"([a-z_]+)(:\{[^}]*\})?\"", source):
        made.add(m.group(1) + (":<plugin>" if m.group(2) else ""))
    documented = set(_table(doc, "The plugin host counts"))
    assert made == documented, f"in code only: {made - documented}; in docs only: {documented - made}"


def test_host_keys_table_matches_the_code(doc: str) -> None:
    from meshd.config.settings import Settings
    from meshd.plugins.config import HOST_KEYS, ISOLATION_MODES

    table = _table(doc, "meshd's own keys in a plugin's section")
    assert set(table) == HOST_KEYS
    assert table["isolation"][0] == f'`"{ISOLATION_MODES[0]}"`'
    for mode in ISOLATION_MODES:
        assert f'`"{mode}"`' in table["isolation"][1]
    default = Settings.model_fields["plugin_queue_size"].default
    assert table["queue_size"][0] == f"`plugin_queue_size` ({default:,})"


def test_node_view_table_matches_the_protocol(doc: str) -> None:
    from meshd.view import NodeView

    members = {name for name in vars(NodeView) if not name.startswith("_")}
    documented = {name.removesuffix("()") for name in _table(doc, "| member | what |")}
    assert documented == members


def test_documented_counter_places_exist(doc: str) -> None:
    from meshd.view import MetricsSnapshot

    # the snapshot fields the docs send plugins to
    assert {"plugin_stats", "plugin_queue"} <= set(MetricsSnapshot.__dataclass_fields__)
    for name in ("plugin_stats", "plugin_queue"):
        assert f"`{name}`" in doc


def test_example_files_are_complete_python(doc: str) -> None:
    files = doc_files(doc)
    assert set(files) == {"meshd_audit.py", "test_meshd_audit.py"}
    for name, source in files.items():
        compile(source, name, "exec")
        assert source.startswith(f"# {name}\n")
