"""Corrupt state never ends in a raw traceback. Start-up says
"cannot start: <file>: <reason> (fix: ...)" and exits 2 (the config-error code, which the systemd
unit does not restart), and one bad outbox row is quarantined, not fatal. Real daemons."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import msgpack
import pytest

from meshd import Agent
from meshd.testing import MeshdFactory, MeshdProcess, wait_until


def _garbage(path: Path) -> None:
    path.write_bytes(b"\x00garbage, not what meshd wrote\xff" * 64)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:200])


def _directory(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.mkdir()
    (path / "x").write_text("x")


CORRUPTIONS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "node_id_is_a_directory": ("node_id", _directory),
    "delivery_db_garbage": ("delivery.db", _garbage),
    "delivery_db_truncated": ("delivery.db", _truncate),
    "delivery_db_is_a_directory": ("delivery.db", _directory),
    "tasks_db_garbage": ("tasks.db", _garbage),
    "tasks_db_is_a_directory": ("tasks.db", _directory),
}


def _bad_keys(path: Path) -> None:
    path.write_text('metadata\ncurve\n    public-key = "short"\n    secret-key = "short"\n')


KEY_CORRUPTIONS: dict[str, tuple[str, Callable[[Path], None]]] = {
    "node_key_garbage": ("keys/node.key_secret", _garbage),
    "node_key_short_keys": ("keys/node.key_secret", _bad_keys),
}


@pytest.mark.parametrize("case", sorted(KEY_CORRUPTIONS))
def test_corrupt_node_key_stops_start_up_with_a_clear_message(meshd_factory: MeshdFactory,
                                                               case: str) -> None:
    name, corrupt = KEY_CORRUPTIONS[case]
    d = _first_run(meshd_factory, secure=True)
    corrupt(d.state_dir / name)
    (d.state_dir / name).chmod(0o600)
    log = d.start_refused(case)
    assert f"cannot start: {d.state_dir / name}:" in log and "fix: " in log, log


def _first_run(meshd_factory: MeshdFactory, secure: bool = False) -> MeshdProcess:
    """A daemon that has run once (its state files exist) and stopped cleanly."""
    d = meshd_factory.spawn("a", secure=secure)
    wait_until(lambda: (d.state_dir / "tasks.db").exists(), what="tasks.db")
    assert d.stop() == 0
    for wal in d.state_dir.glob("*.db-*"):
        wal.unlink()
    return d


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_state_file_stops_start_up_with_a_clear_message(meshd_factory: MeshdFactory,
                                                                 case: str) -> None:
    name, corrupt = CORRUPTIONS[case]
    d = _first_run(meshd_factory)
    corrupt(d.state_dir / name)
    log = d.start_refused(case)
    assert f"cannot start: {d.state_dir / name}:" in log and "(fix: " in log, log


def test_a_bad_outbox_row_is_quarantined_not_fatal(meshd_factory: MeshdFactory) -> None:
    d = _first_run(meshd_factory)
    db = sqlite3.connect(d.state_dir / "delivery.db")
    db.execute("INSERT INTO outbox (id, dest, frames, attempts, created, expires) VALUES (?,?,?,?,?,?)",
               ("bad-row", "nobody", b"\xc1 not msgpack", 0, 0.0, 9e12))
    db.execute("INSERT INTO outbox (id, dest, frames, attempts, created, expires) VALUES (?,?,?,?,?,?)",
               ("bad-shape", "nobody", msgpack.packb({"not": "a list"}), 0, 0.0, 9e12))
    db.commit()
    db.close()
    d.log_path.write_text("")
    d.start()
    info = d.query("node")
    assert info["qos1"]["quarantined"] == 2, info["qos1"]
    db = sqlite3.connect(d.state_dir / "delivery.db")
    kept = sorted(r[0] for r in db.execute("SELECT id FROM quarantine"))
    assert kept == ["bad-row", "bad-shape"]  # kept aside, not deleted
    assert db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0] == 0
    db.close()
    assert "quarantined 2 unreadable qos-1 row(s)" in d.log_tail()

    async def still_works() -> None:
        async with Agent("x", socket=d.socket) as x:
            x.on("t")(lambda m: "ok")
            assert await x.request("x", "t", {}, timeout=5) == "ok"
    asyncio.run(still_works())
