"""The gateway's settings and listen policy (no sockets): bad values name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from meshd.config.settings import load_settings
from meshd.errors import ConfigError
from meshd.gateway.service import check_listen


def settings(**values: object) -> object:
    return load_settings(None, overrides=values, environ={"HOME": "/home/u"})


def test_the_client_does_not_import_aiohttp() -> None:
    code = ("import sys, meshd, meshd.client, meshd.cli, meshd.gateway.auth; "
            "sys.exit(1 if 'aiohttp' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_defaults_are_loopback_and_bounded() -> None:
    s = load_settings(None, environ={"HOME": "/home/u"})
    assert s.http and s.http_host == "127.0.0.1" and s.http_port == 0
    assert s.http_max_sessions > 0 and s.http_max_streams > 0 and s.http_sse_buffer >= 16
    assert check_listen(s) is None


def test_env_turns_it_off() -> None:
    s = load_settings(None, environ={"HOME": "/home/u", "MESHD_HTTP": "off", "MESHD_HTTP_PORT": "8088"})
    assert s.http is False and s.http_port == 8088


@pytest.mark.parametrize(("values", "key"), [
    ({"http_host": "not-an-ip"}, "http_host"),
    ({"http_port": 70000}, "http_port"),
    ({"http_tls_cert": Path("/x.crt")}, "http_tls_key"),
    ({"http_tls_key": Path("/x.key")}, "http_tls_key"),
    ({"http_sse_buffer": 1}, "http_sse_buffer"),
    ({"http_max_body_bytes": 10}, "http_max_body_bytes"),
])
def test_bad_values_name_the_key(values: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings(**values)
    assert info.value.key == key


def test_plain_http_on_a_lan_address_is_refused() -> None:
    s = load_settings(None, overrides={"http_host": "192.168.1.20"}, environ={"HOME": "/home/u"})
    with pytest.raises(ConfigError) as info:
        check_listen(s)
    assert info.value.key == "http_host"
    assert "http_tls_cert" in info.value.message
    s = load_settings(None, overrides={"http_host": "192.168.1.20", "allow_plain_http_lan": True},
                      environ={"HOME": "/home/u"})
    assert check_listen(s) is None


def test_unloadable_certificate_names_the_key(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("not a certificate")
    (tmp_path / "k.pem").write_text("not a key")
    s = load_settings(None, overrides={"http_tls_cert": tmp_path / "c.pem",
                                       "http_tls_key": tmp_path / "k.pem"}, environ={"HOME": "/home/u"})
    with pytest.raises(ConfigError) as info:
        check_listen(s)
    assert info.value.key == "http_tls_cert"
