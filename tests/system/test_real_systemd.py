"""meshd as a systemd service under a real systemd: two booted Debian containers, installed by the docs.

Two containers (systemd 252 as PID 1, ``systemd-nspawn --boot``) on a private bridge with no route
anywhere else. Each gets the project exactly through the commands of docs/operations.md ("Installing":
the block marked for this test is read from the file and run line by line), from a wheelhouse built
on the host from this checkout (the containers have no network). Then, against the real service:
READY and STATUS, the watchdog fed past WatchdogSec and firing on SIGSTOP, restart after kill -9,
a clean stop, a config error and an unreadable key file each exit 2 without a restart loop, meshctl
for a member and a non-member of the ``meshd`` group, and the two nodes answering each other's
requests in keys mode and in secret mode.

Runs as its own CI step (``.ci/run``), outside the default test run (pyproject testpaths). Needs root,
systemd-nspawn, debootstrap and the Debian mirror once (the root is cached in
/var/cache/meshd-systemd-test/); skips saying why when the host cannot boot containers.
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshd.testing import wait_until

from .nspawn import Container, HostCannotBoot, PrivateLan, host_problem

pytestmark = [pytest.mark.system, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations.md"
WHEELHOUSE_IN_CONTAINER = "/root/meshd-wheelhouse"
CHECKOUT_IN_CONTAINER = "/root/meshd"
MESH = "systest"
KEYS = ("runuser -u meshd -- /opt/meshd/bin/meshctl keys --config /etc/meshd/meshd.toml "
        "--state-dir /var/lib/meshd")
CTL = "/opt/meshd/bin/meshctl"
_agent_runs = itertools.count(1)
NO_ACCESS = ("meshctl: permission denied on /run/meshd/meshd.sock: add your user to the 'meshd' group "
             "(usermod -aG meshd bob) and log in again")


def documented_install() -> list[str]:
    """The node-side install commands of docs/operations.md, in order, without comments."""
    text = OPERATIONS.read_text(encoding="utf-8")
    m = re.search(r"<!-- tests/system runs this block -->\s*```sh\n(.*?)```", text, re.S)
    assert m, f"{OPERATIONS}: no block marked '<!-- tests/system runs this block -->'"
    lines = []
    for raw in m.group(1).splitlines():
        line = raw.split("  #", 1)[0].strip()
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def config_text(extra: str = "") -> str:
    return f'mesh = "{MESH}"\n{extra}'


def install(node: Container) -> None:
    """Run the documented install on ``node``; ``cd`` carries over to the lines after it."""
    cwd = "/root"
    for line in documented_install():
        if line.startswith("cd "):
            cwd = line[3:].strip()
        elif line.startswith("apt-get install"):
            # the containers have no network: the cached root has python3-venv (nspawn.PACKAGES)
            node.sh("dpkg -s python3-venv >/dev/null")
        elif line.startswith("$EDITOR "):
            node.sh(f"cat >> {shlex.quote(line.split()[1])}", input_text=config_text())
        else:
            try:
                node.sh(f"cd {shlex.quote(cwd)} && {line}", timeout=600)
            except RuntimeError as exc:  # say why the service failed, not only that it did
                log = node.sh("journalctl -u meshd --no-pager -n 30", check=False).stdout
                raise RuntimeError(f"{exc}\n--- journalctl -u meshd:\n{log}") from None
    # users: alice attaches agents (in the meshd group, as the docs say), bob does not
    node.sh("useradd -m alice && usermod -aG meshd alice && useradd -m bob")


def build_wheelhouse(dest: Path) -> Path:
    """``pip wheel`` of this checkout and its dependencies, as docs/operations.md tells a build machine."""
    src = dest / "checkout"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache"))
    wheels = dest / "meshd-wheelhouse"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheels), str(src)],
                       capture_output=True, text=True, timeout=900, check=False)
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout}\n{r.stderr}"
    return src


@pytest.fixture(scope="module")
def lan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateLan]:
    problem = host_problem()
    if problem:
        pytest.skip(f"cannot boot containers here: {problem}")
    work = tmp_path_factory.mktemp("systemd-install")
    checkout = build_wheelhouse(work)
    binds = {work / "meshd-wheelhouse": WHEELHOUSE_IN_CONTAINER, checkout: CHECKOUT_IN_CONTAINER}
    try:
        network = PrivateLan(2, binds)
    except HostCannotBoot as exc:
        pytest.skip(f"cannot boot containers here: {exc}")
    try:
        for node in network.containers:
            install(node)
        yield network
    finally:
        network.close()


def journal(node: Container) -> str:
    return node.sh("journalctl -u meshd --no-pager -o cat").stdout


def running(node: Container) -> dict[str, str] | None:
    props = node.unit("ActiveState", "SubState", "MainPID", "NRestarts", "StatusText")
    return props if (props["ActiveState"], props["SubState"]) == ("active", "running") else None


def failed(node: Container) -> dict[str, str] | None:
    props = node.unit("ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts")
    return props if props["ActiveState"] == "failed" else None


def set_config(node: Container, extra: str = "") -> None:
    node.sh("cat > /etc/meshd/meshd.toml", input_text=config_text(extra))


def restart(node: Container) -> None:
    """``systemctl restart``; reset-failed first clears the start-rate limit (StartLimitBurst=5 in
    120 s), which this test's many restarts of one node would otherwise hit."""
    node.sh("systemctl reset-failed meshd; systemctl restart meshd", check=False)


def start_echo_agent(node: Container, name: str) -> None:
    """An agent answering requests, run by alice (a meshd group member) as a transient unit; one
    started earlier (its daemon may have restarted since) is stopped first."""
    node.sh("systemctl stop 'echo-agent-*' || true")
    node.sh(f"systemd-run --collect --unit=echo-agent-{next(_agent_runs)} --uid=alice "
            f"{CTL} agent {name} --echo")


def answers(caller: Container, agent: str) -> bool:
    r = caller.sh(f"runuser -u alice -- {CTL} request {agent} ping '{{\"n\": 7}}' --timeout 3", check=False)
    return r.returncode == 0 and json.loads(r.stdout) == {"n": 7}


def request_both_ways(lan: PrivateLan) -> None:
    a, b = lan.containers
    start_echo_agent(a, "echo-node1")
    start_echo_agent(b, "echo-node2")
    wait_until(lambda: answers(a, "echo-node2"), timeout=90, interval=1, what="node1 -> echo-node2")
    wait_until(lambda: answers(b, "echo-node1"), timeout=90, interval=1, what="node2 -> echo-node1")


# ----------------------------------------------------------------------------- one service

def test_service_active_through_ready_with_status_and_modes(lan: PrivateLan) -> None:
    for node in lan.containers:
        assert node.unit("Type")["Type"] == "notify"
        props = running(node)  # `systemctl enable --now` returned: READY=1 arrived
        assert props, node.unit("ActiveState", "SubState", "Result")
        assert props["NRestarts"] == "0"
        assert re.fullmatch(r"\d+/\d+ peers online, \d+ local agents, \d+ remote agents, mesh 'systest'",
                            props["StatusText"]), props["StatusText"]
        modes = node.sh("stat -c '%n %a %U %G' /run/meshd /run/meshd/meshd.sock /var/lib/meshd").stdout
        assert modes.splitlines() == ["/run/meshd 750 meshd meshd", "/run/meshd/meshd.sock 660 meshd meshd",
                                      "/var/lib/meshd 700 meshd meshd"], modes
        status = node.sh(f"cat /proc/{props['MainPID']}/status").stdout
        for line in ("CapEff:\t0000000000000000", "Seccomp:\t2", "NoNewPrivs:\t1"):
            assert line in status, status


def test_meshctl_for_group_member_and_outsider(lan: PrivateLan) -> None:
    node = lan.containers[0]
    member = node.sh(f"runuser -u alice -- {CTL} node")  # no --socket: finds /run/meshd/meshd.sock
    assert json.loads(member.stdout)["socket"] == "/run/meshd/meshd.sock"
    outsider = node.sh(f"runuser -u bob -- {CTL} peers", check=False)
    assert outsider.returncode == 1
    assert outsider.stderr.strip() == NO_ACCESS, outsider.stderr


def test_watchdog_is_fed_and_fires_when_the_daemon_stops(lan: PrivateLan) -> None:
    node = lan.containers[0]
    before = running(node)
    assert before
    assert node.unit("WatchdogUSec")["WatchdogUSec"] == "10s"

    def fed_past_twice_the_limit() -> bool:
        p = node.unit("WatchdogTimestampMonotonic", "ExecMainStartTimestampMonotonic")
        return int(p["WatchdogTimestampMonotonic"]) - int(p["ExecMainStartTimestampMonotonic"]) > 20_000_000

    wait_until(fed_past_twice_the_limit, timeout=60, interval=1, what="WATCHDOG=1 pings past 20 s")
    assert node.unit("MainPID", "NRestarts") == {"MainPID": before["MainPID"], "NRestarts": "0"}
    node.sh(f"kill -STOP {before['MainPID']}")  # a wedged daemon: no more pings
    after = wait_until(lambda: (p := running(node)) and p["MainPID"] != before["MainPID"] and p,
                       timeout=120, interval=1, what="systemd to kill and restart the stopped daemon")
    assert after["NRestarts"] == "1"
    assert "Watchdog timeout" in node.sh("journalctl -u meshd --no-pager").stdout


def test_kill_9_is_restarted(lan: PrivateLan) -> None:
    node = lan.containers[1]
    before = running(node)
    assert before
    node.sh(f"kill -9 {before['MainPID']}")
    after = wait_until(lambda: (p := running(node)) and p["MainPID"] != before["MainPID"] and p,
                       timeout=60, interval=0.5, what="systemd to restart meshd after kill -9")
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1


# ----------------------------------------------------------------------------- two nodes

def test_two_nodes_answer_each_other_in_keys_mode(lan: PrivateLan) -> None:
    a, b = lan.containers
    keys = {}
    for node in (a, b):
        shown = node.sh(f"{KEYS} show").stdout
        keys[node.name] = re.search(r"public key \(z85\): (\S+)", shown).group(1)  # type: ignore[union-attr]
    a.sh(f"{KEYS} trust {b.name} {shlex.quote(keys[b.name])}")
    b.sh(f"{KEYS} trust {a.name} {shlex.quote(keys[a.name])}")
    request_both_ways(lan)


def test_two_nodes_answer_each_other_in_secret_mode(lan: PrivateLan) -> None:
    a, b = lan.containers
    for node in (a, b):  # forget keys-mode trust: only the secret may let them talk
        node.sh("rm -f /var/lib/meshd/authorized_keys/*")
    a.sh(f"{CTL} keys secret --owner meshd /etc/meshd/mesh.secret")  # as docs/operations.md shows
    assert a.sh("stat -c '%a %U %G' /etc/meshd/mesh.secret").stdout.strip() == "600 meshd meshd"
    secret = a.sh("cat /etc/meshd/mesh.secret").stdout
    b.sh("cat > /root/mesh.secret && "
         "install -m 0600 -o meshd -g meshd /root/mesh.secret /etc/meshd/mesh.secret && rm /root/mesh.secret",
         input_text=secret)
    for node in (a, b):
        set_config(node, 'trust_mode = "secret"\nmesh_secret_file = "/etc/meshd/mesh.secret"\n')
        restart(node)
        assert running(node), journal(node)[-2000:]
    request_both_ways(lan)


# ----------------------------------------------------------------------------- errors and stop

def test_unreadable_secret_exits_2_without_restart_loop(lan: PrivateLan) -> None:
    node = lan.containers[1]
    node.sh("chown root:root /etc/meshd/mesh.secret")  # what `meshctl keys secret` as root used to leave
    try:
        restart(node)
        props = wait_until(lambda: failed(node), timeout=60, interval=0.5, what="meshd to fail")
        assert (props["SubState"], props["Result"], props["ExecMainStatus"]) == ("failed", "exit-code", "2")
        assert props["NRestarts"] == "0"
        assert "/etc/meshd/mesh.secret: Permission denied (fix: chown meshd" in journal(node)
    finally:
        node.sh("chown meshd:meshd /etc/meshd/mesh.secret")
    restart(node)
    assert running(node)


def test_config_error_exits_2_without_restart_loop(lan: PrivateLan) -> None:
    node = lan.containers[1]
    set_config(node, "prot = 7000\n")
    restart(node)
    props = wait_until(lambda: failed(node), timeout=60, interval=0.5, what="meshd to fail")
    assert (props["SubState"], props["Result"], props["ExecMainStatus"]) == ("failed", "exit-code", "2")
    assert props["NRestarts"] == "0"
    assert "config error: prot: unknown setting" in journal(node)
    set_config(node)
    restart(node)
    assert running(node)


def test_stop_is_clean(lan: PrivateLan) -> None:
    for node in lan.containers:
        assert running(node)
        run_id = node.unit("InvocationID")["InvocationID"]
        node.sh("systemctl stop meshd")  # returns once the daemon has exited (or was killed)
        props = node.unit("ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
        # exited (code 1 = CLD_EXITED) with 0 by itself: SIGTERM drained, no SIGKILL after TimeoutStopSec
        assert props == {"ActiveState": "inactive", "Result": "success", "ExecMainCode": "1",
                         "ExecMainStatus": "0"}, props
        said = node.sh(f"journalctl _SYSTEMD_INVOCATION_ID={run_id} --no-pager -o cat").stdout
        assert re.search(r"meshd\.node: node [0-9a-f]+ stopped$", said, re.M), said[-2000:]
