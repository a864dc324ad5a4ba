"""The daemon's composition root wires parts at construction only (docs/architecture.md).

node.py and embedded.py build each part with what it calls (typed callback bundles, narrow
Protocols, or the node's own forwarding methods, the ``PeerEvents`` pattern). Assigning an
attribute of another part afterwards (``self.qos.router = self.routing``) hides a two-way
reference no constructor shows: this test finds any such assignment.
"""

from __future__ import annotations

import ast
from pathlib import Path

import meshd

ROOT = Path(meshd.__file__).parent
COMPOSITION_ROOT = ("daemon/node.py", "daemon/embedded.py")
# Classes of those files that are parts themselves (they may set their own records' fields).
OWN_PARTS = {"AgentSockets", "InProcessConnection", "_Reactor"}


def cross_wiring(source: str) -> list[str]:
    """``self.<part>.<attr> = ...`` (or a local's attribute) in methods of the node classes."""
    found: list[str] = []
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef) or cls.name in OWN_PARTS:
            continue
        for node in ast.walk(cls):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = list(node.targets)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if not isinstance(t, ast.Attribute):
                        continue
                    if not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                        found.append(f"{cls.name} line {node.lineno}: {ast.unparse(t)} = ...")
    return found


def test_the_composition_root_assigns_no_attribute_of_another_part() -> None:
    for rel in COMPOSITION_ROOT:
        assert cross_wiring((ROOT / rel).read_text()) == [], rel


def test_the_check_finds_cross_wiring() -> None:
    wired = '''
class Node:
    def _build(self):
        self.qos = Qos1Driver()
        self.qos.router, self.qos.link = self.routing, link
        local = self.local_agents
        local.admin = self.admin
        self.stats["x"] += 1
'''
    assert cross_wiring(wired) == [
        "Node line 5: self.qos.router = ...", "Node line 5: self.qos.link = ...",
        "Node line 7: local.admin = ...",
    ]
