"""What a real idle ``meshd run`` has loaded (read from /proc/PID/maps), and that what it leaves
out loads when it is first needed (idle memory; meshd/util/lazyssl.py, meshd/daemon/reexec.py)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from meshd.testing import MeshdFactory

# Shared objects an idle daemon (default config: HTTP gateway on loopback) must not map.
LEFT_OUT = ("libssl", "libcrypto", "/_ssl.", "/_hashlib.", "/unicodedata.")


def mapped(pid: int) -> set[str]:
    text = Path(f"/proc/{pid}/maps").read_text()
    return {name for name in LEFT_OUT if name in text}


def test_an_idle_daemon_maps_no_openssl_until_its_first_http_request(meshd_factory: MeshdFactory) -> None:
    a = meshd_factory.spawn("a")
    assert mapped(a.pid) == set()
    gw = a.gateway()
    # The first request imports aiohttp, which imports ssl: the daemon serves it as ever.
    req = urllib.request.Request(gw.url + "v1/node", headers={"Authorization": f"Bearer {gw.token}"})

    with urllib.request.urlopen(req, timeout=30) as r:
        assert json.loads(r.read())["node"] == a.node_id
    assert {"libssl", "libcrypto", "/_ssl."} <= mapped(a.pid)


def test_regenerate_id_travels_to_the_reexecd_image(meshd_factory: MeshdFactory) -> None:
    # The re-exec'd image parses no command line: --regenerate-id is handed over with the settings.
    a = meshd_factory.spawn("a")
    old = a.node_id
    a.stop()
    a.args.append("--regenerate-id")
    a.start()
    assert a.node_id != old
    assert "--regenerate-id: removed" in a.log()
