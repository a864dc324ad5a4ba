"""The settings ``meshd run`` hands to its re-exec'd image (meshd/daemon/reexec.py) read like the
validated ones."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from meshd.config.settings import Settings, load_settings
from meshd.daemon import reexec
from meshd.daemon.reexec import SettingsSection, SettingsSnapshot
from meshd.plugins import entrypoints as plugin_entrypoints

CONFIG = """
name = "n1"
mesh = "m1"
interfaces = ["127.0.0.1"]
peers = ["tcp://10.0.0.2:7000"]
http = false
[tasks]
max_stored_tasks = 50
[spawn]
templates = [{name = "w", command = ["/bin/true"], env = {A = "1"}}]
[tools]
approval = {spawn_agent = "deny"}
[plugins.example]
colour = "blue"
"""


def settings(tmp_path: Path) -> Settings:
    path = tmp_path / "meshd.toml"
    path.write_text(CONFIG)
    return load_settings(path, environ={"HOME": str(tmp_path)})


def round_trip(s: Settings) -> SettingsSnapshot:
    fd = os.memfd_create("test", 0)
    os.write(fd, pickle.dumps((reexec.snapshot(s), None)))
    os.lseek(fd, 0, os.SEEK_SET)
    return reexec.read_settings(fd)  # closes fd


def test_snapshot_reads_like_the_validated_settings(tmp_path: Path) -> None:
    s = settings(tmp_path)
    snap = round_trip(s)
    for name in Settings.model_fields:
        value, got = getattr(s, name), getattr(snap, name)
        if name in ("tasks", "tools"):
            assert isinstance(got, SettingsSection)
            assert vars(got) == value.model_dump(), name
        elif name == "a2a":  # the daemon only carries it (meshd a2a reads the file itself)
            assert isinstance(got, SettingsSection)
            assert {k: v for k, v in vars(got).items() if k != "remote_agents"} == \
                value.model_dump(exclude={"remote_agents"})
            assert [vars(r) for r in got.remote_agents] == [r.model_dump() for r in value.remote_agents]
        elif name == "spawn":
            assert [vars(t) for t in got.templates] == [t.model_dump() for t in value.templates]
        else:
            assert got == value and type(got) is type(value), name
    assert snap.plugin_sections == s.plugin_sections == {"example": {"colour": "blue"}}
    assert snap.resolved_socket() == s.resolved_socket()
    assert snap.resolved_authorized_keys() == s.resolved_authorized_keys()
    # What the snapshot lacks (pydantic's API) is answered by a real Settings with the same values.
    assert snap.model_dump() == s.model_dump()
    assert snap.as_settings().plugin_sections == s.plugin_sections


def test_the_daemon_modules_import_no_optional_dependency() -> None:
    # What `meshd run`'s own image imports (the node, the cli, the gateway and tools services at
    # start) loads none of pydantic, aiohttp, mcp, the a2a-sdk and what it brings (protobuf,
    # httpx, starlette, uvicorn), prometheus_client, importlib.metadata.
    probe = ("import sys, meshd.daemon.reexec, meshd.daemon.node, meshd.cli, meshd.gateway.service, "
             "meshd.tools.service, "
             "meshd.tasks.service, meshd.tools.spawn; "
             "print(sorted(m for m in sys.modules if m in ('meshd.config', 'importlib.metadata') or "
             "m.split('.')[0] in ('pydantic', 'pydantic_core', 'aiohttp', 'mcp', 'prometheus_client', 'a2a', "
             "'google', 'httpx', 'starlette', 'uvicorn')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_reexecd_image_imports_no_argparse() -> None:
    probe = ("import sys, meshd.daemon.run, meshd.daemon.reexec, meshd.daemon.node; "
             "print('argparse' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize(("tail", "message"), [(["987654"], "--settings-fd 987654: Bad file descriptor"),
                                               ([], "--settings-fd needs a file descriptor number")])
def test_the_reexecd_image_refuses_a_bad_settings_fd(tail: list[str], message: str) -> None:
    out = subprocess.run([sys.executable, "-m", "meshd", "run", "--settings-fd", *tail],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert message in out.stderr


def test_run_options_travel_with_the_settings(tmp_path: Path) -> None:
    fd = os.memfd_create("test", 0)
    os.write(fd, pickle.dumps((reexec.snapshot(settings(tmp_path)), None, {"regenerate_id": True})))
    os.lseek(fd, 0, os.SEEK_SET)
    snap, options = reexec.read_image(fd)
    assert snap.name == "n1" and options == {"regenerate_id": True}


def test_reexec_only_from_the_real_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(reexec.ENV_SWITCH, raising=False)
    assert reexec.wanted(None)
    assert not reexec.wanted(["run"])  # meshd_main(argv) in-process: never replace the caller
    monkeypatch.setenv(reexec.ENV_SWITCH, "0")
    assert not reexec.wanted(None)


def test_a_bad_settings_fd_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--settings-fd"):
        reexec.read_settings(987654)
    fd = os.memfd_create("test", 0)
    os.write(fd, pickle.dumps({"not": "settings"}))
    os.lseek(fd, 0, os.SEEK_SET)
    with pytest.raises(ValueError, match="not meshd settings"):
        reexec.read_settings(fd)
    fd = os.memfd_create("test", 0)
    os.write(fd, b"garbage")
    os.lseek(fd, 0, os.SEEK_SET)
    with pytest.raises(ValueError, match="not meshd settings"):
        reexec.read_settings(fd)


def test_the_entry_points_listed_before_execv_are_handed_over(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin_entrypoints, "_handed_over", None)
    listed = [("example", "json:dumps", "example 1.0")]
    fd = os.memfd_create("test", 0)
    os.write(fd, pickle.dumps((reexec.snapshot(settings(tmp_path)), listed)))
    os.lseek(fd, 0, os.SEEK_SET)
    reexec.read_settings(fd)
    assert plugin_entrypoints.handed_over() == listed
    assert plugin_entrypoints.load_value("json:dumps") is json.dumps
    assert plugin_entrypoints.load_value("os.path : join [extra]") is os.path.join
    with pytest.raises(ValueError, match="not an entry-point value"):
        plugin_entrypoints.load_value("no spaces allowed here")
