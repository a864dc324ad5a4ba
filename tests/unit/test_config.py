"""Settings loading: defaults, precedence, errors naming key and source, path defaults, conf example."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from socket import gethostname
from typing import Any

import pytest
from pydantic import BaseModel

from meshd.config.sections import RemoteA2aAgent
from meshd.config.settings import (
    Settings,
    SpawnTemplate,
    default_runtime_dir,
    default_socket_path,
    default_state_dir,
    ensure_dirs,
    load_settings,
)
from meshd.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "conf" / "meshd.toml"
SETTING_LINE = re.compile(r"^#\s?([a-z_][a-z0-9_]*)\s*=\s*(.*)$")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "meshd.toml"
    path.write_text(text)
    return path


def load(
    config_file: Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Settings:
    return load_settings(config_file, overrides, environ if environ is not None else {})


# --- defaults and precedence --------------------------------------------------------------------


def test_defaults() -> None:
    s = load(environ={"HOME": "/home/u"})
    assert s.name == gethostname()
    assert s.mesh == "default"
    assert s.interfaces == [] and s.peers == [] and s.plugins == []
    assert (s.port, s.pub_port) == (0, 0)
    assert s.discovery is True and s.insecure is False and s.allow_insecure_lan is False
    assert s.socket is None
    assert (s.heartbeat_interval, s.stale_after, s.offline_after) == (1.0, 3.0, 10.0)
    assert (s.max_payload_bytes, s.inbox_cap, s.hop_limit) == (1048576, 100, 5)
    assert (s.log_level, s.log_format) == ("info", "text")
    assert s.state_dir == Path("/home/u/.local/state/meshd")


def test_file_loads(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        'name = "kitchen"\nmesh = "lab-1"\nport = 5555\npeers = ["tcp://10.0.0.2:5555"]\n'
        'discovery = false\nstate_dir = "~/meshstate"\nlog_level = "DEBUG"\n',
    )
    s = load(path)
    assert s.name == "kitchen" and s.mesh == "lab-1" and s.port == 5555
    assert s.peers == ["tcp://10.0.0.2:5555"]
    assert s.discovery is False
    assert s.state_dir == Path("~/meshstate").expanduser()
    assert s.log_level == "debug"


def test_env_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port = 5555\npub_port = 5556\n")
    s = load(path, environ={"MESHD_PORT": "6000"})
    assert s.port == 6000
    assert s.pub_port == 5556


def test_overrides_beat_env(tmp_path: Path) -> None:
    path = write(tmp_path, "port = 5555\nhop_limit = 3\n")
    env = {"MESHD_PORT": "6000", "MESHD_HOP_LIMIT": "4", "MESHD_MESH": "envmesh"}
    s = load(path, overrides={"port": 7000, "hop_limit": None}, environ=env)
    assert s.port == 7000
    assert s.hop_limit == 4  # None override is ignored
    assert s.mesh == "envmesh"


def test_list_from_env() -> None:
    env = {
        "MESHD_PEERS": "tcp://a.lan:5555, tcp://[fe80::1]:6000,,",
        "MESHD_INTERFACES": "192.168.1.2,10.0.0.1",
        "MESHD_PLUGINS": "",
    }
    s = load(environ=env)
    assert s.peers == ["tcp://a.lan:5555", "tcp://[fe80::1]:6000"]
    assert s.interfaces == ["192.168.1.2", "10.0.0.1"]
    assert s.plugins == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("0", False),
        ("true", True),
        ("FALSE", False),
        ("yes", True),
        ("no", False),
        ("on", True),
        ("Off", False),
    ],
)
def test_bool_from_env(raw: str, expected: bool) -> None:
    assert load(environ={"MESHD_DISCOVERY": raw}).discovery is expected
    assert load(environ={"MESHD_ALLOW_INSECURE_LAN": raw}).allow_insecure_lan is expected


def test_bad_bool_from_env() -> None:
    with pytest.raises(ConfigError) as info:
        load(environ={"MESHD_INSECURE": "maybe"})
    assert info.value.key == "insecure"
    assert "MESHD_INSECURE='maybe'" in str(info.value)


def test_unrelated_env_ignored() -> None:
    s = load(environ={"MESHD_CONFIG": "/nope.toml", "MESHD_BOGUS": "x", "PORT": "1"})
    assert s.port == 0


def test_empty_socket_env_means_default() -> None:
    assert load(environ={"MESHD_SOCKET": ""}).socket is None
    assert load(environ={"MESHD_SOCKET": "/run/x.sock"}).socket == Path("/run/x.sock")


# --- errors name the key and the source ---------------------------------------------------------


def test_bad_value_from_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port = 70000\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert info.value.key == "port"
    assert "less than or equal to 65535" in str(info.value)
    assert str(path) in str(info.value)


def test_bad_value_from_env() -> None:
    with pytest.raises(ConfigError) as info:
        load(environ={"MESHD_PORT": "70000"})
    assert info.value.key == "port"
    assert info.value.message == (
        "port: Input should be less than or equal to 65535 (from MESHD_PORT='70000')"
    )


def test_bad_value_from_flag() -> None:
    with pytest.raises(ConfigError) as info:
        load(overrides={"hop_limit": 0})
    assert info.value.key == "hop_limit"
    assert "flag --hop-limit=0" in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("mesh", "has space"),
        ("mesh", "x" * 64),
        ("name", "a@b"),
        ("name", "  "),
        ("interfaces", ["eth0"]),
        ("peers", ["udp://h:1"]),
        ("peers", ["tcp://h"]),
        ("peers", ["tcp://h:0"]),
        ("peers", ["tcp://h:99999"]),
        ("peers", ["tcp://:5555"]),
        ("heartbeat_interval", 0),
        ("max_payload_bytes", 1000),
        ("max_payload_bytes", 64 * 1024 * 1024 + 1),
        ("inbox_cap", 0),
        ("hop_limit", 65),
        ("log_level", "verbose"),
        ("log_format", "xml"),
        ("plugins", ["not a module"]),
        ("socket", Path("/" + "s" * 200)),
    ],
)
def test_invalid_values_name_the_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        load(overrides={key: value})
    assert info.value.key.split(".")[0] == key
    assert "flag --" in str(info.value)


def test_unknown_file_key(tmp_path: Path) -> None:
    path = write(tmp_path, "prot = 5555\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert info.value.key == "prot"
    assert str(path) in str(info.value)
    assert "'port'" in str(info.value)  # suggestion


def test_bad_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'mesh = "ok"\nport = = 3\n')
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(path) in str(info.value)
    assert "line 2" in str(info.value)


def test_missing_file_is_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path / "absent.toml")
    assert "absent.toml" in str(info.value)


def test_cross_field_stale_after(tmp_path: Path) -> None:
    path = write(tmp_path, "heartbeat_interval = 2.0\nstale_after = 2.0\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert info.value.key == "stale_after"
    assert "heartbeat_interval" in str(info.value)


def test_cross_field_offline_after() -> None:
    with pytest.raises(ConfigError) as info:
        load(environ={"MESHD_OFFLINE_AFTER": "2.5"})
    assert info.value.key == "offline_after"
    assert "stale_after" in str(info.value) and "MESHD_OFFLINE_AFTER" in str(info.value)


def test_cross_field_against_default() -> None:
    with pytest.raises(ConfigError) as info:
        load(overrides={"heartbeat_interval": 5.0})
    assert info.value.key == "stale_after"
    assert "heartbeat_interval (5.0)" in str(info.value) and "default value" in str(info.value)


def test_cross_field_ok_when_all_raised() -> None:
    s = load(overrides={"heartbeat_interval": 5.0, "stale_after": 15.0, "offline_after": 60.0})
    assert s.offline_after == 60.0


# --- paths ----------------------------------------------------------------------------------------


def test_runtime_dir_systemd() -> None:
    env = {"RUNTIME_DIRECTORY": "/run/meshd:/run/other", "XDG_RUNTIME_DIR": "/run/user/1"}
    assert default_runtime_dir(env) == Path("/run/meshd")
    assert default_socket_path(env) == Path("/run/meshd/meshd.sock")


def test_runtime_dir_xdg() -> None:
    assert default_runtime_dir({"XDG_RUNTIME_DIR": "/run/user/1"}) == Path("/run/user/1/meshd")


def test_runtime_dir_fallback() -> None:
    assert default_runtime_dir({}) == Path(f"/tmp/meshd-{os.getuid()}")
    assert default_runtime_dir({"XDG_RUNTIME_DIR": ""}) == Path(f"/tmp/meshd-{os.getuid()}")


def test_runtime_dir_uses_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/42")
    assert default_socket_path() == Path("/run/user/42/meshd/meshd.sock")
    assert load().resolved_socket() == Path("/run/user/42/meshd/meshd.sock")
    assert load(overrides={"socket": Path("/x/y.sock")}).resolved_socket() == Path("/x/y.sock")


def test_state_dir_resolution() -> None:
    assert default_state_dir({"STATE_DIRECTORY": "/var/lib/meshd"}) == Path("/var/lib/meshd")
    assert default_state_dir({"XDG_STATE_HOME": "/s"}) == Path("/s/meshd")
    assert default_state_dir({"HOME": "/home/u"}) == Path("/home/u/.local/state/meshd")
    assert load(environ={"STATE_DIRECTORY": "/var/lib/meshd"}).state_dir == Path("/var/lib/meshd")


def test_ensure_dirs(tmp_path: Path) -> None:
    s = load(overrides={"state_dir": tmp_path / "a" / "state", "socket": tmp_path / "run" / "m.sock"})
    ensure_dirs(s)
    ensure_dirs(s)  # idempotent
    assert (tmp_path / "a" / "state").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "run").stat().st_mode & 0o777 == 0o750


def test_ensure_dirs_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    s = load(overrides={"state_dir": tmp_path / "file"})
    with pytest.raises(ConfigError) as info:
        ensure_dirs(s)
    assert info.value.key == "state_dir"


# --- the commented example in conf/ ---------------------------------------------------------------


SECTION_LINE = re.compile(r"^#\s?\[\[?([a-z0-9_.]+)\]\]?\s*$")
EXAMPLE_ONLY = frozenset({"spawn.templates", "a2a.remote_agents"})  # an example entry, not a default
ARRAY_TABLES = frozenset({"spawn.templates", "a2a.remote_agents"})


def example_sections() -> dict[str, dict[str, str]]:
    """The commented settings of the example, by section ("" = top level, "tasks", "spawn"...)."""
    found: dict[str, dict[str, str]] = {"": {}}
    section = ""
    for line in EXAMPLE.read_text().splitlines():
        head = SECTION_LINE.match(line)
        if head:
            section = head.group(1)
            found.setdefault(section, {})
            continue
        m = SETTING_LINE.match(line)
        if m:
            found[section][m.group(1)] = line.lstrip("#").strip()
    return found


def example_settings() -> dict[str, str]:
    return example_sections()[""]


def example_toml(skip: frozenset[str] = frozenset()) -> str:
    """The example with every setting uncommented (sections in ``skip`` left out)."""
    parts = []
    for section, settings in example_sections().items():
        if section in skip:
            continue
        if section:
            parts.append(f"[[{section}]]" if section in ARRAY_TABLES else f"[{section}]")
        parts += list(settings.values())
    return "\n".join(parts) + "\n"


def test_example_is_all_comments() -> None:
    assert tomllib.loads(EXAMPLE.read_text()) == {}
    load(EXAMPLE)


def test_example_covers_every_field() -> None:
    sections = example_sections()
    nested = {name for name, f in Settings.model_fields.items()
              if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}
    assert set(sections[""]) | nested == set(Settings.model_fields)
    for name in nested:
        model = Settings.model_fields[name].annotation
        assert set(sections[name]) | {"templates", "remote_agents"} >= set(model.model_fields), name  # type: ignore[union-attr]
        assert set(sections[name]) <= set(model.model_fields), name  # type: ignore[union-attr]
    assert set(sections["spawn.templates"]) == set(SpawnTemplate.model_fields)
    assert set(sections["a2a.remote_agents"]) == set(RemoteA2aAgent.model_fields)


def test_example_template_loads(tmp_path: Path) -> None:
    s = load(write(tmp_path, example_toml()), environ={"HOME": "/home/u"})
    assert [t.name for t in s.spawn.templates] == ["summarizer"]
    assert s.spawn.templates[0].restart == "on-failure"


def test_example_values_are_the_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, example_toml(EXAMPLE_ONLY))
    s = load(path, environ={"HOME": "/home/u"})
    defaults = load(environ={"HOME": "/home/u"})
    for key in Settings.model_fields:
        if key in {"name", "state_dir", "socket", "authorized_keys_dir", "mesh_secret_file", "otlp_endpoint",
                   "http_tls_cert", "http_tls_key", "a2a"}:  # examples (a2a: its default_agent, signing_key)
            continue
        assert getattr(s, key) == getattr(defaults, key), key


def test_sections_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tasks\.max_attemps"):
        load(write(tmp_path, "[tasks]\nmax_attemps = 2\n"))
    with pytest.raises(ConfigError, match=r"spawn\.templates"):
        load(write(tmp_path, '[[spawn.templates]]\nname = "a"\ncommand = ["x"]\n'
                             '[[spawn.templates]]\nname = "a"\ncommand = ["y"]\n'))
    with pytest.raises(ConfigError, match=r"spawn\.templates\.0\.command"):
        load(write(tmp_path, '[[spawn.templates]]\nname = "a"\ncommand = []\n'))
