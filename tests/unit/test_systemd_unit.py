"""systemd/meshd.service must be a valid, hardened Type=notify unit; systemd/meshd.sysusers must parse.

- ``systemd-analyze verify`` runs on a temporary copy whose ExecStart points at this venv's ``meshd``
  (the shipped unit names /opt/meshd/bin/meshd, which does not exist on a build machine, and verify
  checks that the binary is executable). Any line it prints about our unit fails the test: verify
  reports unknown keys and bad values as warnings and still exits 0.
- ``systemd-analyze security --offline=true`` must rate the unit's overall exposure at 2.0 or lower.
- The settings the daemon relies on (Type=notify, WatchdogSec, the three directories, ...) are there.

Needs systemd-analyze (Debian/Ubuntu: ``apt-get install -y --no-install-recommends systemd``); the
tests that run it are skipped, saying so, when it is missing. Nothing is installed or started.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "meshd.service"
SYSUSERS = ROOT / "systemd" / "meshd.sysusers"
MAX_EXPOSURE = 2.0
SHIPPED_EXEC = "/opt/meshd/bin/meshd"

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(
    ANALYZE is None,
    reason="systemd-analyze not installed (apt-get install -y --no-install-recommends systemd)",
)


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value in order (keys such as SystemCallFilter may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"setting outside a section: {raw!r}"
        assert "=" in line, f"not KEY=VALUE: {raw!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def unit() -> dict[str, dict[str, list[str]]]:
    assert UNIT.is_file(), f"{UNIT} is missing"
    return parse_unit(UNIT.read_text(encoding="utf-8"))


def service_value(unit: dict[str, dict[str, list[str]]], key: str) -> str:
    values = unit.get("Service", {}).get(key)
    assert values, f"[Service] has no {key}="
    return values[-1]


def local_exec_start() -> str:
    """This environment's meshd entry point, for an ExecStart that verify can check."""
    script = Path(sys.executable).with_name("meshd")
    if script.is_file():
        return str(script)
    return f"{sys.executable} -m meshd"  # an uninstalled checkout: same program


@pytest.fixture
def verifiable_unit(tmp_path: Path) -> Path:
    """A copy of the unit, named meshd.service, whose ExecStart exists on this machine."""
    text = UNIT.read_text(encoding="utf-8")
    assert f"ExecStart={SHIPPED_EXEC} " in text, f"ExecStart no longer starts with {SHIPPED_EXEC}"
    copy = tmp_path / "meshd.service"
    copy.write_text(text.replace(f"ExecStart={SHIPPED_EXEC} ", f"ExecStart={local_exec_start()} "),
                    encoding="utf-8")
    return copy


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


# ----------------------------------------------------------------------------- static checks

def test_notify_service_with_watchdog(unit: dict[str, dict[str, list[str]]]) -> None:
    assert service_value(unit, "Type") == "notify"
    assert service_value(unit, "NotifyAccess") == "main"
    watchdog = service_value(unit, "WatchdogSec")
    assert re.fullmatch(r"\d+s?", watchdog), f"WatchdogSec={watchdog}: expected whole seconds"
    assert int(watchdog.rstrip("s")) >= 2, "meshd pings at half of WatchdogSec from a 1 s status loop"
    assert service_value(unit, "ExecStart").split()[:4] == [
        SHIPPED_EXEC, "run", "--config", "/etc/meshd/meshd.toml"]
    assert service_value(unit, "KillSignal") == "SIGTERM"
    assert service_value(unit, "Restart") == "on-failure"
    assert "2" in service_value(unit, "RestartPreventExitStatus").split(), "exit 2 (config) must not loop"


def test_directories_user_and_umask(unit: dict[str, dict[str, list[str]]]) -> None:
    assert service_value(unit, "StateDirectory") == "meshd"
    assert service_value(unit, "StateDirectoryMode") == "0700"
    assert service_value(unit, "RuntimeDirectory") == "meshd"
    assert service_value(unit, "RuntimeDirectoryMode") == "0750"
    assert service_value(unit, "ConfigurationDirectory") == "meshd"
    assert service_value(unit, "UMask") == "0007"
    user = service_value(unit, "User")
    assert service_value(unit, "Group") == user
    sysusers = SYSUSERS.read_text(encoding="utf-8")
    assert re.search(rf"^u\s+{re.escape(user)}\s", sysusers, re.M), f"{SYSUSERS.name} does not create {user}"


def test_sandbox_settings(unit: dict[str, dict[str, list[str]]]) -> None:
    expected = {
        "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "PrivateDevices": "yes",
        "NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "",
        "SystemCallArchitectures": "native", "MemoryDenyWriteExecute": "yes", "ProtectProc": "invisible",
        "ProcSubset": "pid", "DevicePolicy": "closed",
    }
    for key, value in expected.items():
        assert service_value(unit, key) == value, f"{key}= should be {value!r}"
    assert service_value(unit, "RestrictRealtime") == "yes"
    filters = unit["Service"]["SystemCallFilter"]
    assert filters[:2] == ["@system-service", "~@privileged @resources"], filters
    # libzmq aborts unless it may call sched_setscheduler (SCHED_OTHER) on its I/O threads; nothing
    # else of @resources comes back (RestrictRealtime=yes still refuses realtime policies).
    assert filters[2:] == ["sched_setscheduler"], filters
    families = set(service_value(unit, "RestrictAddressFamilies").split())
    assert families == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}, families
    assert "IPAddressDeny" not in unit["Service"], "mesh peers are anywhere on the LAN"


# ----------------------------------------------------------------------------- systemd-analyze

@needs_analyze
def test_systemd_analyze_verify_is_clean(verifiable_unit: Path) -> None:
    assert ANALYZE is not None
    result = run(ANALYZE, "verify", str(verifiable_unit))
    output = (result.stdout + result.stderr).splitlines()
    ours = [line for line in output if "meshd.service" in line or str(verifiable_unit.parent) in line]
    assert result.returncode == 0 and not ours, (
        f"systemd-analyze verify (exit {result.returncode}) complained:\n" + "\n".join(ours or output))


@needs_analyze
def test_verify_catches_a_bad_key(tmp_path: Path) -> None:
    """The check above means something: verify does print a line for a bad key in our unit."""
    assert ANALYZE is not None
    bad = tmp_path / "meshd.service"
    bad.write_text(f"[Service]\nExecStart={sys.executable} -V\nProtectSystem=bogus\n", encoding="utf-8")
    result = run(ANALYZE, "verify", str(bad))
    assert "meshd.service" in result.stdout + result.stderr


def offline_supported() -> bool:
    assert ANALYZE is not None
    return "--offline" in run(ANALYZE, "--help").stdout


@needs_analyze
def test_security_exposure_at_most_2(verifiable_unit: Path) -> None:
    assert ANALYZE is not None
    if not offline_supported():
        pytest.skip("this systemd-analyze has no --offline (systemd < 250): cannot rate a unit file")
    result = run(ANALYZE, "security", "--offline=true", "--no-pager", str(verifiable_unit))
    text = result.stdout + result.stderr
    match = re.search(r"Overall exposure level for meshd\.service:\s*([0-9]+(?:\.[0-9]+)?)", text)
    assert match, f"no overall exposure in systemd-analyze security output:\n{text}"
    exposure = float(match.group(1))
    failing = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("✗"))
    assert exposure <= MAX_EXPOSURE, f"exposure {exposure} > {MAX_EXPOSURE}; unmet:\n{failing}"


@pytest.mark.skipif(shutil.which("systemd-sysusers") is None, reason="systemd-sysusers not installed")
def test_sysusers_file_parses() -> None:
    tool = shutil.which("systemd-sysusers")
    assert tool is not None
    result = run(tool, "--dry-run", str(SYSUSERS))
    complaints = [line for line in result.stderr.splitlines() if SYSUSERS.name in line]
    assert result.returncode == 0 and not complaints, result.stderr
