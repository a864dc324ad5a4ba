"""Mesh-secret mode (CurveZMQ, one keypair derived from a shared secret) across 3 netlab hosts,
and a daemon holding another secret on the same LAN that sees nothing and injects nothing."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from meshd.mesh.keys import create_mesh_secret
from meshd.testing import short_tempdir, wait_until

from .conftest import FAST, MultiHost, Netlab, NetnsDaemon, _prefix, running, skip_reason

pytestmark = pytest.mark.multihost


@pytest.fixture(scope="module")
def secret_mesh(request: pytest.FixtureRequest) -> Iterator[MultiHost]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    workdir = short_tempdir("mshsec-")
    secret = workdir / "mesh.secret"
    create_mesh_secret(secret)
    mh = MultiHost(Netlab(_prefix()), workdir, mesh=f"sec{uuid.uuid4().hex[:10]}", secret=secret)
    with running(request, mh):
        yield mh


def test_secret_mode_across_three_hosts(secret_mesh: MultiHost) -> None:
    secret_mesh.wait_full_mesh()
    reply = secret_mesh.agents[1].request("echo3", "echo", {"over": "curve"}, timeout=10)
    assert reply == {"host": 3, "from": "echo1", "payload": {"over": "curve"}}
    assert "INSECURE" not in secret_mesh.daemons[1].log()


def test_other_secret_on_the_same_lan_sees_nothing(secret_mesh: MultiHost) -> None:
    secret_mesh.wait_full_mesh()
    other_secret = secret_mesh.workdir / "other.secret"
    create_mesh_secret(other_secret)
    config = secret_mesh.workdir / "other.toml"
    config.write_text(f'trust_mode = "secret"\nmesh_secret_file = "{other_secret}"\n')
    # a stranger on host 2's LAN address (its own daemon, same mesh name, wrong secret)
    stranger = NetnsDaemon(secret_mesh.lab.host(2), "stranger", secret_mesh.mesh, secret_mesh.workdir,
                           ["--config", str(config), "--interface", secret_mesh.address(2), *FAST],
                           secure=True)
    stranger.start()
    try:
        # It is discovered on mDNS, but its key is not the mesh key: nobody dials it, and its
        # own dials fail the CURVE handshake (it pins a server key we do not have).
        def ignored() -> bool:
            return all(int(secret_mesh.daemons[i].query("node")["stats"].get("untrusted_adverts", 0)) >= 1
                       for i in (1, 3))
        wait_until(ignored, timeout=20, what="hosts 1 and 3 to ignore the stranger's advert")
        assert stranger.node_id not in secret_mesh.peer_states(1)
        assert {s for s in stranger.peer_states().values()} <= {"offline"}
        assert "echo1" not in {a["name"] for a in stranger.query("agents")}
    finally:
        stranger.terminate()
    # the mesh itself is unaffected
    assert secret_mesh.agents[1].request("echo2", "echo", 1, timeout=10)["host"] == 2
