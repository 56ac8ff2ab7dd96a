"""A Ray fleet across the namespace hosts, started the way an owner starts one: `sparkctl fleet
init` on host a, `sparkctl fleet join` on the others, each inside its host with its own state dir.

`cluster(hosts, ...)` is a context manager the fleet test modules use for their module's cluster
(about 20 s to start, printed), with `sparkctl daemon` on host a (`HeadDaemon`, its gateway on a's
address, its JSON log read back for its fleet events): it owns the placement book, so `fleet up`,
`ps` and `down` ask it. `Cluster.sparkctl` runs any `sparkctl` command on a host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from sparkctl.adapters import processes
from sparkctl.deploy.health import http_status
from sparkctl.fleet import local
from sparkctl.instance import LABEL as INSTANCE_LABEL
from tests.fakes.hub import Hub, HubServer
from tests.fakes.repos import GEMMA4, seed_repos
from tests.fleet.hosts import Host, Hosts
from tests.fleet.network import LINK
from tests.teardown import stop

RAY_TIMEOUT = 40
START_TIMEOUT = 2 * (RAY_TIMEOUT + 30) + 20  # two `ray start`s (raynode.START_ATTEMPTS), each to its deadline
IMAGE = "ghcr.io/sparkctl-test/fleet-sim"  # the sim image, as the hosts pull it from the bridge registry


class HeadDaemon:
    """`sparkctl daemon` on host a, its gateway on a's address."""

    def __init__(self, cluster: Cluster, *, port: int, env: dict[str, str] | None = None) -> None:
        a = cluster.hosts["a"]
        self.url = f"http://{a.address}:{port}"
        self.log_path = cluster.root / "daemon.log"
        # many faults in a few minutes are the point here, not a crash loop: the rule is tested elsewhere
        env = cluster.env_for(a) | {"SPARKCTL_GATEWAY_HOST": a.address, "SPARKCTL_GATEWAY_PORT": str(port),
                                    "SPARKCTL_CRASH_LOOP": "100",
                                    "SPARKCTL_SWITCH_HOLD_TIMEOUT": "150", **(env or {})}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([*a.enter(), sys.executable, "-m", "sparkctl", "daemon"], stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 120  # its start is ~2 CPU-s of imports: minutes on a loaded machine
        while http_status(self.url + "/health") != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()[-3000:]
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def until(self, condition: Callable[[], object], timeout: float) -> None:
        """Wait for `condition`; past `timeout`, fail with the daemon's last log lines."""
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, self.log()[-4000:]
            time.sleep(0.05)

    def events(self, name: str) -> list[dict]:
        found = []
        for line in self.log().splitlines():
            if f'"{name}"' in line:
                try:
                    found.append(json.loads(line[line.index("{"):]))
                except ValueError:
                    continue
        return found

    def stop(self) -> None:
        stop(self.proc, 30)


class Cluster:
    def __init__(self, hosts: Hosts, root: Path, *, instance: str, port: int, env: dict[str, str]) -> None:
        self.hosts, self.root, self.instance, self.port, self.env = hosts, root, instance, port, env
        self.head = f"{hosts['a'].address}:{port}"
        self.daemon: HeadDaemon | None = None  # the head's, which `fleet up`, `ps` and `down` ask

    def env_for(self, host: Host) -> dict[str, str]:
        """A sparkctl process's environment on `host`: its own state dir, caches and Docker."""
        return {**os.environ, "SPARKCTL_STATE_DIR": str(self.root / host.name), "SPARKCTL_INSTANCE": self.instance,
                "SPARKCTL_FLEET_FILE": str(self.root / "fleet.yaml"), "SPARKCTL_FLEET_NUM_CPUS": "1",
                "SPARKCTL_FLEET_OBJECT_STORE_MIB": "100", "SPARKCTL_FLEET_DEAD_AFTER": "2",
                "SPARKCTL_FLEET_RAY_TIMEOUT": str(RAY_TIMEOUT), "COLUMNS": "200",
                "SPARKCTL_HF_CACHE_DIR": str(self.root / host.name / "hf"), "SPARKCTL_DOCKER_HOST": host.docker_url,
                **self.env}

    def sparkctl(self, host: Host, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """`sparkctl ARGS` run on `host` (inside its namespaces) with that host's state dir."""
        return subprocess.run([*host.enter(), sys.executable, "-m", "sparkctl", *args], capture_output=True,
                              text=True, env=self.env_for(host), timeout=timeout)

    def fleet(self, *args: str, on: str = "a", timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return self.sparkctl(self.hosts[on], "fleet", *args, timeout=timeout)

    def up(self, stack: str, *, wait: float = 240) -> tuple[int, str]:
        """`sparkctl fleet up STACK` on the head: its exit code and output."""
        done = self.fleet("up", stack, "--wait", str(wait), timeout=wait + 60)
        return done.returncode, done.stdout + done.stderr

    def book(self) -> dict:
        """The head's book of placed stacks."""
        path = self.root / "a" / "fleet" / "placements.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def hosts_of(self, stack: str) -> list[str]:
        return [r["host"] for r in self.book()[stack]["replicas"]]

    def join(self, host: Host) -> None:
        token = self.root / "a" / "fleet" / local.TOKEN_FILE
        done = self.fleet("join", self.head, "--host", host.name, "--token-file", str(token), on=host.name,
                          timeout=START_TIMEOUT)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"host agent {host.name} runs" in done.stdout, done.stdout

    def stop_all(self) -> None:
        """Every host's Ray and agent (by pid), then this instance's containers on every host: a
        host whose node was dead when its stacks were taken down still has them."""
        for host in self.hosts:
            record = local.read_record(self.root / host.name / "fleet" / local.RECORD_FILE)
            if record is not None:
                processes.stop(processes.Session.from_dict(record.handle), grace=0, sig=9)
        for host in self.hosts:
            ids = host.docker("ps", "-aq", "--filter", f"label={INSTANCE_LABEL}={self.instance}").split()
            if ids:
                host.docker("rm", "-f", *ids)


@contextmanager
def cluster(hosts: Hosts, *, instance: str, port: int, gateway_port: int, memory: dict[str, str] | None = None,
            env: dict[str, str] | None = None, daemon_env: dict[str, str] | None = None) -> Iterator[Cluster]:
    """Head on a, the other hosts joined, every agent up, then the head's daemon (its gateway on
    a's address at `gateway_port`); all of it stopped (by pid) at the end. `memory`: a host's
    ceiling in the inventory (default 2GiB)."""
    root = Path(tempfile.mkdtemp(prefix="sg", dir="/tmp"))  # short: Ray's unix sockets live under it
    lines = ["head: a", "hosts:"]
    for host in hosts:
        lines.append(f"  - {{name: {host.name}, serving: {{interface: {LINK}, address: {host.address}}}, "
                     f"memory: {(memory or {}).get(host.name, '2GiB')}, ray: {{address: {host.address}, "
                     f"port: {port}}}, docker: '{host.docker_url}'}}")
    (root / "fleet.yaml").write_text("\n".join(lines) + "\n")
    made = Cluster(hosts, root, instance=instance, port=port, env=env or {})
    started = time.monotonic()
    try:
        done = made.fleet("init", "--host", "a", timeout=START_TIMEOUT)
        assert done.returncode == 0, done.stdout + done.stderr
        with ThreadPoolExecutor(len(hosts.hosts)) as pool:
            list(pool.map(made.join, [h for h in hosts if h.name != "a"]))
        made.daemon = HeadDaemon(made, port=gateway_port, env=daemon_env)
        print(f"\nRay head on a, workers on the others, agents and the head's daemon up: "
              f"{time.monotonic() - started:.1f} s")
        yield made
    finally:
        if made.daemon is not None:
            made.daemon.stop()
        made.stop_all()
        subprocess.run(["rm", "-rf", str(root)], check=False)


def stack_file(name: str, fraction: float, port: int, placement: dict, **more: object) -> str:
    """A stack of the sim serving Gemma-4 (it needs a fraction >= 0.16), placed as `placement`
    says, with `more` top-level keys (e.g. `parallel`)."""
    return json.dumps({
        "name": name, "image": {"repository": IMAGE, "tag": "v1"}, "model": {"repo": GEMMA4, "revision": "main"},
        "vllm": {"port": port, "max_model_len": 2048}, "resources": {"gpu_memory_utilization": fraction},
        "health": {"start": 60, "load": 120, "ready": 60, "canary": 60}, "placement": placement, **more,
    })


@contextmanager
def deployable(hosts: Hosts, sim_image: str, model_dir: Path, stacks_dir: Path,
               stacks: dict[str, tuple]) -> Iterator[dict[str, str]]:
    """What the hosts' agents deploy from: the stack files (name: fraction of a 2 GiB "Spark",
    port, placement[, more keys]), the sim image in the bridge registry and a Hub on the bridge.
    Yields the environment that points sparkctl at them."""
    for name, (fraction, port, where, *more) in stacks.items():
        (stacks_dir / f"{name}.yaml").write_text(stack_file(name, fraction, port, where, **(more[0] if more else {})))
    hosts.registry.push(sim_image, IMAGE.removeprefix("ghcr.io/") + ":v1")
    with HubServer(Hub(seed_repos(model_dir)), host=hosts.network.gateway) as hub:
        yield {"SPARKCTL_STACKS_DIR": str(stacks_dir), "SPARKCTL_PATCHES_DIR": str(stacks_dir / "none"),
               "SPARKCTL_REGISTRY_MIRRORS": f"ghcr.io={hosts.registry.bridge_host}",
               "SPARKCTL_HF_ENDPOINT": hub.endpoint, "SPARKCTL_GPUS": "none",
               "SPARKCTL_ENGINE_ENV": "SPARKCTL_SIM_TIME_SCALE=0.01", "SPARKCTL_MEMORY_TOTAL_GIB": "2",
               "SPARKCTL_ENGINE_OVERHEAD_GIB": "0",  # the KV cache is the fraction less the (tiny) weights
               "SPARKCTL_MEMORY_CEILING": "1.0"}  # the inventory's ceilings are the ones that count here
