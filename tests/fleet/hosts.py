"""Hosts as network namespaces: `Hosts(n)` gives n "Sparks" on one machine, each a namespace on
the test's own bridge with its own containerd and dockerd, and a registry reachable from all of
them. The fleet tests (issues 17 and 18) take them from the session fixture in conftest.py.

Each host's daemons run in its network namespace (entered with `nsenter --net`, not `ip netns
exec`, which remounts /sys and breaks dockerd's cgroups) and in a private mount, UTS and IPC
namespace, with the host's own hostname and /dev/shm: `--network host` containers of that dockerd
see only `lo` and the host's `cx7`. Killing every process of a namespace takes the host down;
`start()` brings it back on the same data. Everything is named after a per-run tag, and `sweep`
removes exactly that run's namespaces, links, cgroups, processes and files, whatever state a
failed test left them in.
"""

from __future__ import annotations

import atexit
import http.client
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from tests.fleet import network
from tests.fleet.images import BridgeRegistry, seed_root
from tests.fleet.network import HarnessError, Network

CGROUP_ROOT = Path("/sys/fs/cgroup")
NAMES = "abcdefgh"
TOOLS = ("ip", "nsenter", "unshare", "containerd", "dockerd", "docker", "docker-registry")


class Host:
    """One "Spark": a namespace with an address, a containerd and a dockerd of its own."""

    def __init__(self, name: str, *, netns: str, address: str, root: Path, registry: str) -> None:
        self.name, self.netns, self.address, self.root = name, netns, address, root
        self.registry = registry  # the bridge-side registry, as this host's dockerd reaches it
        self.socket = root / "docker.sock"
        self.docker_url = f"unix://{self.socket}"
        self.hostname = f"spark-{name}"
        self.timings: dict[str, float] = {}
        self._procs: dict[str, subprocess.Popen] = {}
        root.mkdir(parents=True, exist_ok=True)
        (root / "containerd.toml").write_text(_containerd_config(root))
        (root / "daemon.json").write_text("{}\n")  # not the machine's /etc/docker/daemon.json

    def start(self) -> None:
        """Start containerd, then dockerd inside its namespaces; returns once dockerd answers."""
        self.launch_containerd()
        self.launch_dockerd()
        self.wait_ready()

    def launch_containerd(self) -> None:
        started = time.monotonic()
        for stale in ("containerd.sock", "docker.sock"):  # left by a kill: they must not look ready
            (self.root / stale).unlink(missing_ok=True)
        inside = (f"hostname {self.hostname} && mount -t tmpfs -o mode=1777 shm /dev/shm && "
                  f"echo 1 > /proc/sys/net/ipv6/conf/{network.LINK}/disable_ipv6 && "
                  f"exec containerd --config {self.root / 'containerd.toml'}")
        # nsenter and unshare exec without forking: the Popen's pid is containerd's
        self._spawn("containerd", ["nsenter", f"--net={network.NETNS_DIR / self.netns}", "unshare", "--mount",
                                   "--uts", "--ipc", "--propagation", "slave", "sh", "-c", inside])
        _wait(lambda: (self.root / "containerd.sock").is_socket(), self._procs["containerd"], 20,
              f"containerd of host {self.name}", self.root / "containerd.log")
        self.timings["containerd"] = time.monotonic() - started

    def launch_dockerd(self) -> None:
        self._dockerd_started = time.monotonic()
        self._spawn("dockerd", [
            *self.enter(), "dockerd", "-H", self.docker_url, "--config-file", str(self.root / "daemon.json"),
            "--data-root", str(self.root / "docker"), "--exec-root", str(self.root / "exec"),
            "--pidfile", str(self.root / "docker.pid"), "--containerd", str(self.root / "containerd.sock"),
            "--bridge=none", "--iptables=false", "--ip6tables=false", "--cgroup-parent", f"/{self.netns}",
            "--insecure-registry", self.registry, "--registry-mirror", f"http://{self.registry}"])

    def enter(self) -> list[str]:
        """The command prefix that runs a process on this host: its network, mount, UTS and IPC
        namespaces (its address, hostname and /dev/shm), e.g. for a Ray node."""
        return ["nsenter", f"--target={self._procs['containerd'].pid}", "--net", "--mount", "--uts", "--ipc"]

    def wait_ready(self, timeout: float = 30) -> None:
        _wait(self.answers, self._procs["dockerd"], timeout, f"dockerd of host {self.name}", self.root / "dockerd.log")
        self.timings["dockerd"] = time.monotonic() - self._dockerd_started

    def answers(self) -> bool:
        """Whether this host's dockerd answers /_ping on its socket."""
        return _ping(self.socket)

    def docker(self, *args: str, input: bytes | None = None, timeout: float = 300) -> str:
        """The docker CLI against this host's dockerd; raises with its stderr on failure."""
        done = subprocess.run(["docker", "-H", self.docker_url, *args], input=input, capture_output=True,
                              timeout=timeout, check=False)
        if done.returncode != 0:
            raise HarnessError(f"docker {' '.join(args)} on host {self.name}: {done.stderr.decode()[-2000:]}")
        return done.stdout.decode()

    def pids(self) -> list[int]:
        return network.pids(self.netns)

    def kill(self) -> None:
        """Take the host down as a power cut would: SIGKILL to every process of its namespace and of
        its containers' cgroups, until none is left."""
        kill_cgroups(self.netns)
        network.wait_gone(self.netns)
        kill_cgroups(self.netns)
        for proc in self._procs.values():
            proc.wait()
        self._procs.clear()

    def stop(self) -> None:
        """Remove this host's containers through its dockerd, then kill what is left."""
        if self.answers():
            ids = self.docker("ps", "-aq").split()
            if ids:
                self.docker("rm", "-f", *ids, timeout=60)
        self.kill()

    def logs(self, daemon: str = "dockerd") -> str:
        path = self.root / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _spawn(self, daemon: str, command: list[str]) -> None:
        with open(self.root / f"{daemon}.log", "ab") as log:
            self._procs[daemon] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True)


class Hosts:
    """`with Hosts(3) as hosts:` three hosts up on a fresh bridge, with a bridge-side registry;
    all of it removed on exit, also when setup or the test failed."""

    def __init__(self, count: int = 2, *, seeds: Mapping[str, Path] | None = None) -> None:
        if not 1 <= count <= len(NAMES):
            raise ValueError(f"between 1 and {len(NAMES)} hosts, not {count}")
        self.count = count
        self.seeds = seeds or {}  # host name -> an image's seed for its data root (tests/fleet/images.py)
        self.tag = network.run_tag()
        self.run_id = self.tag.removeprefix(network.TAG_PREFIX)
        self.root = Path(tempfile.gettempdir()) / self.tag  # short: unix socket paths stay < 108 bytes
        self.hosts: list[Host] = []
        self.timings: dict[str, float] = {}

    def __enter__(self) -> Hosts:
        atexit.register(sweep, self.tag)  # if the process ends before __exit__ (idempotent)
        try:
            self._up()
        except BaseException:
            sweep(self.tag)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for host in self.hosts:
                host.stop()
            self.registry.stop()
        finally:
            sweep(self.tag)

    def __getitem__(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def __iter__(self):
        return iter(self.hosts)

    def _up(self) -> None:
        check_machine()
        started = time.monotonic()
        self.root.mkdir(mode=0o700)
        self.network = Network(self.tag)
        self.registry = BridgeRegistry(self.root / "registry", bridge=self.network.gateway)
        self.timings["network+registry"] = time.monotonic() - started
        for name in NAMES[: self.count]:
            wired = time.monotonic()
            netns, address = self.network.add(name)
            self.hosts.append(Host(name, netns=netns, address=address, root=self.root / name,
                                   registry=self.registry.bridge_host))
            self.hosts[-1].timings["network"] = time.monotonic() - wired
        for name, seed in self.seeds.items():
            seeded = time.monotonic()
            try:
                seed_root(self[name].root / "docker", seed)
            except subprocess.CalledProcessError:  # e.g. a cache on another filesystem: no hard links
                shutil.rmtree(self[name].root / "docker", ignore_errors=True)
                continue
            self[name].timings["seed"] = time.monotonic() - seeded
        for host in self.hosts:  # containerds start together, then the dockerds
            host.launch_containerd()
        for host in self.hosts:
            host.launch_dockerd()
        for host in self.hosts:
            host.wait_ready()
        self.timings["total"] = time.monotonic() - started

    def summary(self) -> str:
        """One line per host of what its setup cost (printed at the end of the session)."""
        lines = [f"fleet harness: {self.count} hosts on {self.network.subnet} in {self.timings['total']:.2f} s "
                 f"(bridge + registry {self.timings['network+registry']:.2f} s)"]
        for host in self.hosts:
            spent = ", ".join(f"{k} {v:.2f} s" for k, v in host.timings.items())
            lines.append(f"  {host.name} {host.address}: {spent}")
        return "\n".join(lines)


def check_machine() -> None:
    """Fail (never skip) with what is missing: CI runs the fleet tests as root on a machine like this."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise HarnessError(f"the fleet tests need {', '.join(missing)}: run `make setup` (scripts/host-setup.sh)")
    if os.geteuid() != 0:
        raise HarnessError("the fleet tests create network namespaces and start dockerd: run them as root")


def sweep(tag: str) -> None:
    """Remove everything named after `tag`: processes (by the PIDs of this run's namespaces and
    cgroups, and of commands that name this run's directory), cgroups, namespaces, links, files."""
    root = Path(tempfile.gettempdir()) / tag
    for netns in network.namespaces(tag):
        kill_cgroups(netns)
        network.wait_gone(netns)
        kill_cgroups(netns)
    for pid in _naming(root):
        network._kill(pid)
    for cgroup in cgroups(tag):
        _rmdir_tree(cgroup)
    network.remove(tag)
    shutil.rmtree(root, ignore_errors=True)


def cgroups(tag: str) -> list[Path]:
    """The cgroup parents of this run's hosts, in every hierarchy (v1 and v2)."""
    return sorted(CGROUP_ROOT.glob(f"{tag}-*")) + sorted(CGROUP_ROOT.glob(f"*/{tag}-*"))


def kill_cgroups(netns: str) -> None:
    """SIGKILL every task in a host's container cgroups (a container not on the host network
    lives in a namespace of its own, out of `ip netns pids`' sight)."""
    for parent in [*CGROUP_ROOT.glob(netns), *CGROUP_ROOT.glob(f"*/{netns}")]:
        for directory, _, files in os.walk(parent):  # a container's cgroup may go while this walks: skipped
            if "cgroup.procs" in files:
                try:
                    pids = (Path(directory) / "cgroup.procs").read_text().split()
                except OSError:
                    continue
                for pid in pids:
                    network._kill(int(pid))


def _rmdir_tree(path: Path) -> None:
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        sub.rmdir()
    path.rmdir()


def _naming(root: Path) -> list[int]:
    """PIDs whose command line names this run's directory (the registries, a stray daemon)."""
    needle = f"{root}/".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if needle in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _wait(ready, proc: subprocess.Popen, timeout: float, what: str, log: Path) -> None:
    """Poll `ready` until true; fail early with the log tail if the process exits."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            state = f"exited {proc.returncode}" if proc.returncode is not None else f"not ready after {timeout} s"
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise HarnessError(f"{what} {state}; its log ({log}):\n{tail}")
        time.sleep(0.02)


def _ping(path: Path) -> bool:
    if not path.is_socket():
        return False
    conn = _UnixHTTPConnection(str(path))
    try:
        conn.request("GET", "/_ping")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=2)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(2)
        self.sock.connect(self.path)


def _containerd_config(root: Path) -> str:
    """containerd with its own root, state and sockets (the machine's containerd is left alone)."""
    return (f'version = 2\nroot = "{root}/containerd/root"\nstate = "{root}/containerd/state"\n'
            f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{root}/containerd.sock"\n'
            f'[ttrpc]\n  address = "{root}/containerd.sock.ttrpc"\n'
            f'[debug]\n  address = "{root}/containerd-debug.sock"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{root}/containerd/opt"\n')
