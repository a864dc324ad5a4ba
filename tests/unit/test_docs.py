"""docs/PROTOCOL.md must describe the protocol the code speaks: fail when the two drift apart.

Each check reads the constants from meshd.wire.protocol, so adding a kind, an error code, a header key
or a limit without documenting it fails here; so does documenting a kind or code that no longer
exists. No sockets.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshd.wire import protocol as P

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"

NODE_PATH = DOC_PATH.parents[1] / "meshd" / "daemon" / "admin.py"  # where the admin ops are answered

# Module-level str constants of meshd.wire.protocol that are not header keys; every other one is.
NOT_HEADER_KEYS = frozenset({"HANDOFF_TOPIC", "DAEMON_PREFIX", "NOTICE"})  # NOTICE: an error-map key (§7)


def _constants(namespace: object) -> dict[str, str]:
    """The upper-case str constants of a class or module."""
    return {name: value for name, value in vars(namespace).items()
            if name.isupper() and isinstance(value, str)}


KINDS = _constants(P.Kind)
HEADER_KEYS = {name: value for name, value in _constants(P).items() if name not in NOT_HEADER_KEYS}
ERROR_CODES = _constants(P.ErrorCode)
LIMIT_NAME = r"(?:DEFAULT_)?MAX_[A-Z_]+|BATCH_OVERHEAD"
LIMITS = {name: value for name, value in vars(P).items()
          if re.fullmatch(LIMIT_NAME, name) and isinstance(value, int)}


@pytest.fixture(scope="module")
def doc() -> str:
    assert DOC_PATH.is_file(), f"{DOC_PATH} is missing"
    return DOC_PATH.read_text(encoding="utf-8")


def _table_rows(doc: str, marker: str) -> list[list[str]]:
    """The cells of each body row of the table right after ``<!-- table:marker -->``."""
    start = doc.find(f"<!-- table:{marker} -->")
    assert start >= 0, f"table marker {marker!r} missing from {DOC_PATH.name}"
    rows: list[list[str]] = []
    in_table = False
    for line in doc[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    body = rows[2:]  # skip the heading row and the |---| rule
    assert body, f"table {marker!r} has no rows"
    return body


def _backticked(cell: str) -> str | None:
    match = re.fullmatch(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def _table_first_column(doc: str, marker: str) -> list[str]:
    """The backticked values in the first column of the table after ``<!-- table:marker -->``."""
    values = [_backticked(row[0]) for row in _table_rows(doc, marker)]
    assert None not in values, f"table {marker!r} has a first cell that is not a `value`"
    return [v for v in values if v is not None]


def test_constants_found() -> None:
    # Guard the introspection itself: an empty set would make every test below pass vacuously.
    assert len(KINDS) >= 23 and len(ERROR_CODES) >= 12 and len(HEADER_KEYS) >= 20
    assert {"KIND", "ID", "FROM", "TO", "CORR", "ORIGIN", "IDS", "QOS", "VER"} <= set(HEADER_KEYS)
    assert {"MAX_HEADER_BYTES", "DEFAULT_MAX_PAYLOAD_BYTES", "MAX_BATCH", "MAX_NAME_LEN",
            "MAX_TOPIC_LEN", "BATCH_OVERHEAD"} <= set(LIMITS)


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_kind_documented(doc: str, name: str) -> None:
    value = KINDS[name]
    assert f"`{value}`" in doc, f"Kind.{name} = {value!r} is not in {DOC_PATH.name}"


def test_kinds_table_matches_code(doc: str) -> None:
    documented = _table_first_column(doc, "kinds")
    assert sorted(documented) == sorted(KINDS.values())
    assert set(documented) == P.KNOWN_KINDS


@pytest.mark.parametrize("name", sorted(ERROR_CODES))
def test_every_error_code_documented(doc: str, name: str) -> None:
    value = ERROR_CODES[name]
    assert f"`{value}`" in doc, f"ErrorCode.{name} = {value!r} is not in {DOC_PATH.name}"


def test_error_code_table_matches_code(doc: str) -> None:
    assert sorted(_table_first_column(doc, "error-codes")) == sorted(ERROR_CODES.values())


@pytest.mark.parametrize("name", sorted(HEADER_KEYS))
def test_every_header_key_documented(doc: str, name: str) -> None:
    value = HEADER_KEYS[name]
    assert f"`{value}`" in doc, f"header key {name} = {value!r} is not in {DOC_PATH.name}"
    assert f"`{name}`" in doc, f"constant name {name} is not in {DOC_PATH.name}"


def test_header_key_table_matches_code(doc: str) -> None:
    assert sorted(_table_first_column(doc, "header-keys")) == sorted(HEADER_KEYS.values())
    # The second column names the constant that holds the key.
    columns = {_backticked(row[0]): _backticked(row[1]) for row in _table_rows(doc, "header-keys")}
    assert columns == {value: name for name, value in HEADER_KEYS.items()}


def test_handoff_topic_documented(doc: str) -> None:
    assert f"`{P.HANDOFF_TOPIC}`" in doc and "`HANDOFF_TOPIC`" in doc


def test_admin_ops_documented(doc: str) -> None:
    ops = set(re.findall(r'\bop == "([a-z_.]+)"', NODE_PATH.read_text(encoding="utf-8")))
    assert ops, f"no admin op found in {NODE_PATH.name}: update this check"
    missing = sorted(op for op in ops if f"`{op}`" not in doc)
    assert not missing, f"admin ops {missing} are not in {DOC_PATH.name}"


def test_signature_documented(doc: str) -> None:
    assert P.SIGNATURE[:3] == b"MSH" and P.SIGNATURE[3] == P.PROTOCOL_VERSION
    assert "`MSH`" in doc or '"MSH"' in doc
    assert " ".join(f"{b:02x}" for b in P.SIGNATURE) in doc, "signature hex dump missing"
    assert f"`PROTOCOL_VERSION` = {P.PROTOCOL_VERSION}" in doc
    assert re.search(rf"protocol,? version {P.PROTOCOL_VERSION}\b", doc, re.IGNORECASE)


@pytest.mark.parametrize("name", sorted(LIMITS))
def test_every_limit_documented_with_its_value(doc: str, name: str) -> None:
    value = LIMITS[name]
    lines = [line for line in doc.splitlines() if f"`{name}`" in line]
    assert lines, f"limit {name} is not in {DOC_PATH.name}"
    assert any(re.search(rf"(?<![\d.]){value}(?![\d.])", line) for line in lines), (
        f"no line of {DOC_PATH.name} gives {name} with its value {value}"
    )


def test_limit_table_matches_code(doc: str) -> None:
    rows: dict[str, str] = {}
    for row in _table_rows(doc, "limits"):
        name = _backticked(row[1])
        if name is not None:
            rows[name] = row[2]
    assert set(rows) == set(LIMITS), "the limits table and the limit constants differ"
    for name, value_cell in rows.items():
        assert re.match(rf"{LIMITS[name]}(?![\d.])", value_cell), (
            f"limits table gives {name} as {value_cell!r}, the code says {LIMITS[name]}"
        )
    named = set(re.findall(rf"`({LIMIT_NAME})`", doc))
    assert named == set(LIMITS), "docs name limit constants that meshd.wire.protocol does not define"


def test_topic_envelope_documented(doc: str) -> None:
    assert P.topic_key("news") == b"news\x00"
    assert '`topic + "\\x00"`' in doc


def test_routed_payloads_never_decoded_stated(doc: str) -> None:
    assert "Daemons never decode the payload of a routed message" in doc


ARCH_PATH = DOC_PATH.parent / "architecture.md"


def _meshd_names() -> dict[str, object]:
    import importlib
    import pkgutil

    import meshd

    names: dict[str, object] = {}
    for info in pkgutil.walk_packages(meshd.__path__, "meshd."):
        leaf = info.name.rsplit(".", 1)[1]
        if leaf.startswith("_"):
            continue
        module = importlib.import_module(info.name)
        names.setdefault(leaf, module)
        for attr, value in vars(module).items():
            if getattr(value, "__module__", None) == module.__name__:
                names.setdefault(attr, value)
    return names


def test_every_function_named_in_architecture_exists() -> None:
    """docs/architecture.md names the function at each step; each must exist in meshd/."""
    text = ARCH_PATH.read_text(encoding="utf-8")
    names = _meshd_names()
    from meshd.client import Agent

    names.setdefault("Agent", Agent)
    dotted = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)`", text))
    assert len(dotted) > 30, "architecture.md names too few functions: update this check"
    missing = []
    for owner, attr in sorted(dotted):
        if owner in ("meshd", "header") or attr == "py":  # a file name, checked below
            continue
        target = names.get(owner)
        if target is None or not hasattr(target, attr):
            missing.append(f"{owner}.{attr}")
    assert not missing, f"architecture.md names what does not exist: {missing}"
    root = DOC_PATH.parents[1]
    paths = set(re.findall(r"\bmeshd/[a-z_/]+(?:\.py|/)", text))
    assert len(paths) > 20, paths
    assert not [p for p in sorted(paths) if not (root / p).exists()], "architecture.md names missing files"


def test_architecture_describes_every_package() -> None:
    """One row per package of meshd/ in the packages table, and no row for a package that is gone."""
    text = ARCH_PATH.read_text(encoding="utf-8")
    package = DOC_PATH.parents[1] / "meshd"
    packages = {f"meshd/{p.parent.name}/" for p in package.glob("*/__init__.py")}
    rows = set(re.findall(r"^\| `(meshd/[a-z0-9_]+/)` \|", text, flags=re.M))
    assert rows == packages, f"not described: {packages - rows}; described but gone: {rows - packages}"
    for init in package.glob("*/__init__.py"):
        doc = init.read_text(encoding="utf-8")
        assert doc.startswith('"""') and "import" in doc.split('"""')[1], (
            f"{init.parent.name}/__init__.py must say what it holds and what it may import")


def test_architecture_start_and_stop_steps_match_the_node() -> None:
    from meshd.daemon.node import START_STEPS, STOP_STEPS

    text = ARCH_PATH.read_text(encoding="utf-8")
    for marker, steps in (("start", START_STEPS), ("stop", STOP_STEPS)):
        line = text.split(f"<!-- steps:{marker} -->\n", 1)[1].splitlines()[0]
        assert re.findall(r"`([a-z_]+)`", line) == list(steps), f"{marker} steps drifted: {line}"


def test_readme_layout_lists_every_package() -> None:
    readme = (DOC_PATH.parents[1] / "README.md").read_text(encoding="utf-8")
    package = DOC_PATH.parents[1] / "meshd"
    missing = [f"meshd/{p.parent.name}/" for p in package.glob("*/__init__.py")
               if f"`meshd/{p.parent.name}/`" not in readme]
    missing += [p.name for p in package.glob("*.py")
                if not p.name.startswith("_") and f"meshd/{p.name}" not in readme]
    assert not missing, f"README layout table misses {missing}"
