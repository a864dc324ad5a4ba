"""Booted Debian containers with systemd as PID 1, on a private LAN, for tests/system.

Owns: the cached Debian root (debootstrap, built once and kept outside the repository), the private
network (network namespaces with a bridge: no route anywhere else), and the containers
(``systemd-nspawn --boot``) with a way to run commands inside them. Everything it creates carries a
name unique to this test process and is removed by ``close()``, also after a failure.
Must not touch: the host's own network, other helpers' netlab namespaces, anything of the project
itself (the tests install it into the containers the way docs/operations.md says).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

CACHE = Path(os.environ.get("MESHD_SYSTEM_TEST_CACHE", "/var/cache/meshd-systemd-test"))
SUITE = "bookworm"
# systemd as PID 1 and D-Bus; python3-venv because docs/operations.md installs meshd in a venv;
# iproute2 to look at addresses when something fails. util-linux (runuser) and passwd (useradd,
# usermod) are in every Debian base system.
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "iproute2")
ROOTFS_RECIPE = 1  # bump when the way the root is built changes: the cache key includes it
SUBNET = "198.18.50"  # inside our own namespaces only (198.18.0.0/15 is reserved for benchmarks)
CONTAINER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HostCannotBoot(Exception):
    """This host cannot boot containers (not root, tools missing, no mirror): the tests skip with it."""


def run(cmd: Sequence[str], *, timeout: float = 120, check: bool = True,
        input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, input=input_text,
                       check=False)
    if check and r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def host_problem() -> str | None:
    """Why this host cannot run the tests, or None."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn, network namespaces)"
    for tool, package in (("systemd-nspawn", "systemd-container"), ("debootstrap", "debootstrap"),
                          ("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    return None


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (``$MESHD_SYSTEM_TEST_MIRROR`` overrides it)."""
    if os.environ.get("MESHD_SYSTEM_TEST_MIRROR"):
        return os.environ["MESHD_SYSTEM_TEST_MIRROR"]
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        with contextlib.suppress(OSError):
            text = path.read_text()
            for m in re.finditer(r"^URIs:\s*(\S+)", text, re.M):  # deb822
                if m.group(1).rstrip("/").endswith("/debian"):
                    return m.group(1)
            for m in re.finditer(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+" + SUITE + r"\s", text, re.M):
                if m.group(1).rstrip("/").endswith("/debian"):
                    return m.group(1)
    return "http://deb.debian.org/debian"


def cached_root() -> Path:
    """The Debian root for the containers, built by debootstrap on first use and kept in CACHE.

    Keyed by suite, mirror, package list and recipe: a change to any rebuilds it. Containers never
    write to it (each boots a copy).
    """
    mirror = debian_mirror()
    key = hashlib.sha256(f"{ROOTFS_RECIPE} {SUITE} {mirror} {' '.join(PACKAGES)}".encode()).hexdigest()[:16]
    root = CACHE / f"{SUITE}-{key}"
    if (root / ".complete").exists():
        return root
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building the same root: wait for it
        if (root / ".complete").exists():
            return root
        building = CACHE / f"{root.name}.building"
        shutil.rmtree(building, ignore_errors=True)
        r = run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                 str(building), mirror], timeout=1800, check=False)
        if r.returncode != 0:
            shutil.rmtree(building, ignore_errors=True)
            raise HostCannotBoot(f"debootstrap {SUITE} from {mirror} failed: {r.stderr.strip()[-500:]}")
        (building / ".complete").write_text(f"{SUITE} {mirror} {' '.join(PACKAGES)}\n")
        building.rename(root)
    return root


class Container:
    """One booted container: ``systemd-nspawn --boot`` on a copy of the cached root."""

    def __init__(self, name: str, root: Path, netns: str, binds: dict[Path, str]) -> None:
        self.name = name
        self.root = root
        self.netns = netns
        log = root.parent / f"{name}.console"
        self.console = log
        self._console = open(log, "w")  # noqa: SIM115  (closed in stop())
        cmd = ["systemd-nspawn", "--quiet", "--boot", "--register=no", "--keep-unit",
               f"--directory={root}", f"--machine={name}", f"--hostname={name}",
               f"--network-namespace-path=/run/netns/{netns}", "--console=pipe"]
        cmd += [f"--bind-ro={src}:{dst}" for src, dst in binds.items()]
        self.process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._console,
                                        stderr=subprocess.STDOUT)
        self.leader = self._find_leader()
        self.sh("systemctl is-system-running --wait || true", timeout=120)

    def _find_leader(self, timeout: float = 60) -> int:
        """The container's PID 1 as the host sees it: nspawn's child."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise HostCannotBoot(f"systemd-nspawn exited {self.process.returncode}: "
                                     f"{self.console.read_text()[-1000:]}")
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text()
                for pid in children.split():
                    if Path(f"/proc/{pid}/comm").read_text().strip() == "systemd":
                        return int(pid)
            time.sleep(0.1)
        raise HostCannotBoot(f"no systemd started in container {self.name} within {timeout} s")

    def sh(self, script: str, *, check: bool = True, timeout: float = 120,
           input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a shell script inside the container as root (all its namespaces, a clean environment)."""
        cmd = ["nsenter", f"--target={self.leader}", "--mount", "--uts", "--ipc", "--net", "--pid",
               "--root", "--wd", "env", "-i", f"PATH={CONTAINER_PATH}", "HOME=/root", "LANG=C.UTF-8",
               "/bin/sh", "-c", script]
        r = run(cmd, timeout=timeout, check=False, input_text=input_text)
        if check and r.returncode != 0:
            raise RuntimeError(f"[{self.name}] {script!r} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r

    def unit(self, *props: str) -> dict[str, str]:
        """``systemctl show meshd`` properties."""
        out = self.sh(f"systemctl show meshd -p {','.join(props)}").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # nspawn asks the container's systemd to power off
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.terminate()  # a second SIGTERM: terminate at once
                try:
                    self.process.wait(15)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(15)
        self._console.close()


class PrivateLan:
    """N booted containers on one bridge inside a namespace of its own: they see each other only."""

    def __init__(self, count: int, binds: dict[Path, str]) -> None:
        problem = host_problem()
        if problem:
            raise HostCannotBoot(problem)
        base = cached_root()
        tag = f"msd{os.getpid() % 100000}"  # unique per test process; netlab uses other prefixes
        self.switch = f"{tag}sw"
        self.workdir = Path(tempfile.mkdtemp(prefix="meshd-systemd-", dir="/var/tmp"))
        self.hosts: list[str] = []
        self.containers: list[Container] = []
        try:
            run(["ip", "netns", "add", self.switch])
            run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for i in range(1, count + 1):
                host = f"{tag}n{i}"
                run(["ip", "netns", "add", host])
                self.hosts.append(host)
                run(["ip", "link", "add", f"{tag}v{i}", "type", "veth", "peer", "name", "eth0",
                     "netns", host])
                run(["ip", "link", "set", f"{tag}v{i}", "netns", self.switch])
                run(["ip", "-n", self.switch, "link", "set", f"{tag}v{i}", "master", "br0", "up"])
                run(["ip", "-n", host, "addr", "add", f"{SUBNET}.{i}/24", "dev", "eth0"])
                run(["ip", "-n", host, "link", "set", "eth0", "up"])
                run(["ip", "-n", host, "link", "set", "lo", "up"])
            for i, host in enumerate(self.hosts, 1):
                root = self.workdir / f"node{i}"
                run(["cp", "-a", "--reflink=auto", str(base), str(root)], timeout=600)
                (root / "etc" / "hostname").write_text(f"node{i}\n")  # debootstrap copied the host's
                self.containers.append(Container(f"node{i}", root, host, binds))
        except BaseException:
            self.close()
            raise

    def address(self, index: int) -> str:
        return f"{SUBNET}.{index + 1}"

    def close(self) -> None:
        for c in self.containers:
            with contextlib.suppress(Exception):
                c.stop()
        for host in [*self.hosts, self.switch]:
            run(["ip", "netns", "del", host], check=False)  # its veths go with it
        shutil.rmtree(self.workdir, ignore_errors=True)


@contextlib.contextmanager
def private_lan(count: int, binds: dict[Path, str]) -> Iterator[PrivateLan]:
    lan = PrivateLan(count, binds)
    try:
        yield lan
    finally:
        lan.close()
