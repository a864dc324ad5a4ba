"""The layer rule of docs/architecture.md: import-linter contracts (pyproject.toml), every module
importing on its own, and no import cycle at module level.

The contracts are also shown to fail: a copy of the package with one forbidden import added must
break them, so this test cannot pass vacuously. No sockets.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import meshd

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "meshd"
PYPROJECT = ROOT / "pyproject.toml"


def _lint(root: Path, config: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the ``meshd`` package found first on ``root``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    probe = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", probe, "--config", str(config), "--no-cache"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_the_layer_contracts_hold() -> None:
    done = _lint(ROOT, PYPROJECT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(" KEPT") >= 4 and " BROKEN" not in done.stdout, done.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("wire/protocol.py", "from meshd.cli import main as _x", "layers"),
    ("client/agent.py", "from meshd.delivery import router as _x", "layers"),
    ("delivery/router.py", "from meshd.client import agent as _x", "daemon parts never import"),
    ("wire/payloads.py", "import asyncio as _x", "the wire layer is pure"),
    ("tools/registry.py", "from meshd.daemon import node as _x", "layers"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    shutil.copytree(PACKAGE, tmp_path / "meshd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(PYPROJECT, tmp_path / "pyproject.toml")
    target = tmp_path / "meshd" / module
    text = target.read_text()
    # after the module docstring and `from __future__`, where an import may stand
    anchor = "from __future__ import annotations\n"
    assert anchor in text
    target.write_text(text.replace(anchor, anchor + line + "\n", 1))
    done = _lint(tmp_path, tmp_path / "pyproject.toml")
    assert done.returncode != 0, done.stdout
    broken = [ln for ln in done.stdout.splitlines() if " BROKEN" in ln]
    assert any(ln.startswith(contract) for ln in broken), done.stdout


def _modules() -> list[str]:
    return sorted(info.name for info in pkgutil.walk_packages(meshd.__path__, "meshd.")
                  if info.name != "meshd.__main__")


def _import_alone(name: str) -> str | None:
    """Import ``name`` in a fresh interpreter; the error's last line, or None."""
    done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True,
                          timeout=60)
    if done.returncode == 0:
        return None
    return f"{name}: {(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}"


def test_every_module_imports_alone() -> None:
    """As python-zeroconf's and aiohttp's test_circular_imports: each module, first in its process."""
    modules = _modules()
    assert len(modules) > 100, modules
    with multiprocessing.get_context("spawn").Pool(max(os.cpu_count() or 1, 2)) as pool:
        failed = [err for err in pool.map(_import_alone, modules) if err is not None]
    assert not failed, failed


def _module_level_imports(path: Path) -> set[str]:
    """The meshd modules a file imports when it is imported (TYPE_CHECKING blocks and function
    bodies left out: those run later, or never)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                test = node.test
                if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
                    visit(node.orelse)
                    continue
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("meshd"):
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("meshd"))

    visit(ast.parse(path.read_text()).body)
    return found


def test_no_import_cycle_at_module_level() -> None:
    files = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        files[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = set()
        for target in _module_level_imports(path):
            pieces = target.split(".")
            for i in range(2, len(pieces) + 1):  # importing a.b.c imports the packages a.b first
                prefix = ".".join(pieces[:i])
                if prefix in files and prefix != name and not name.startswith(prefix + "."):
                    edges.add(prefix)
        graph[name] = edges
    cycles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not cycles, cycles
