"""Host agents across namespace hosts: a Ray head on host a and workers on b and c, each started
by `sparkctl fleet init|join` inside its host, and `sparkctl fleet ps | down | check-image` run
on the head, answered by each host's agent through that host's own dockerd.

Slow (one Ray cluster for the module, about 20 s to start, printed): it covers what the unit tests
of the census and the drift verdict cannot, that agents pin to their hosts and own those hosts'
Docker engines, that `down` returns only after the host's Docker confirms the containers gone,
that a killed host is named unreachable within a bounded time (exit 1) instead of being left
out, and that after it rejoins its agent runs once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sparkctl import instance as instances
from sparkctl.adapters import processes
from sparkctl.container import LABEL_STACK
from sparkctl.fleet import local
from tests.fleet.hosts import Host, Hosts
from tests.fleet.network import LINK

PORT = 27600  # every host's first Ray port: each host has its own network namespace
INSTANCE = "fleetagents"
RAY_TIMEOUT = 40


class Cluster:
    def __init__(self, hosts: Hosts, root: Path) -> None:
        self.hosts, self.root = hosts, root
        self.head = f"{hosts['a'].address}:{PORT}"

    def sparkctl(self, host: Host, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        """`sparkctl fleet ARGS` run on `host` (inside its namespaces) with that host's state dir."""
        env = {**os.environ, "SPARKCTL_STATE_DIR": str(self.root / host.name), "SPARKCTL_INSTANCE": INSTANCE,
               "SPARKCTL_FLEET_FILE": str(self.root / "fleet.yaml"), "SPARKCTL_FLEET_NUM_CPUS": "1",
               "SPARKCTL_FLEET_OBJECT_STORE_MIB": "100", "SPARKCTL_FLEET_DEAD_AFTER": "2",
               "SPARKCTL_FLEET_RAY_TIMEOUT": str(RAY_TIMEOUT), "COLUMNS": "200"}
        return subprocess.run([*host.enter(), sys.executable, "-m", "sparkctl", "fleet", *args], capture_output=True,
                              text=True, env=env, timeout=timeout)

    def join(self, host: Host) -> None:
        token = self.root / "a" / "fleet" / local.TOKEN_FILE
        done = self.sparkctl(host, "join", self.head, "--host", host.name, "--token-file", str(token))
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"host agent {host.name} runs" in done.stdout, done.stdout

    def ps(self) -> tuple[int, dict]:
        done = self.sparkctl(self.hosts["a"], "ps", "--json", "--wait", "8")
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)

    def stop_all(self) -> None:
        for name in "abc":
            record = local.read_record(self.root / name / "fleet" / local.RECORD_FILE)
            if record is not None:
                processes.stop(processes.Session.from_dict(record.handle), grace=0, sig=9)


@pytest.fixture(scope="module")
def cluster(fleet: Hosts) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="sg", dir="/tmp"))  # short: Ray's unix sockets live under it
    lines = ["head: a", "hosts:"]
    for host in fleet:
        lines.append(f"  - {{name: {host.name}, serving: {{interface: {LINK}, address: {host.address}}}, "
                     f"memory: 2GiB, ray: {{address: {host.address}, port: {PORT}}}, docker: '{host.docker_url}'}}")
    (root / "fleet.yaml").write_text("\n".join(lines) + "\n")
    cluster = Cluster(fleet, root)
    started = time.monotonic()
    try:
        done = cluster.sparkctl(fleet["a"], "init", "--host", "a")
        assert done.returncode == 0, done.stdout + done.stderr
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(cluster.join, [fleet["b"], fleet["c"]]))
        print(f"\nRay head on a, workers on b and c, agents up: {time.monotonic() - started:.1f} s")
        yield cluster
    finally:
        cluster.stop_all()
        subprocess.run(["rm", "-rf", str(root)], check=False)


def run_labelled(host: Host, image: str, stack: str) -> str:
    """A container of this instance's `stack` on `host`, as sparkctl labels its own."""
    return host.docker("run", "-d", "--network", "none", "--label", f"{LABEL_STACK}={stack}", "--label",
                       f"{instances.LABEL}={INSTANCE}", "--name", f"agents-{stack}", "--entrypoint", "sleep", image,
                       "600").strip()


def test_ps_lists_each_hosts_containers_and_down_confirms(cluster: Cluster, fleet_sim: str) -> None:
    b = cluster.hosts["b"]
    assert {h.name: len(agent_processes(h)) for h in cluster.hosts} == {"a": 1, "b": 1, "c": 1}  # each on its host
    run_labelled(b, fleet_sim, "tiny")
    code, seen = cluster.ps()
    assert code == 0 and seen["unreachable"] == {} and seen["hosts"] == ["a", "b", "c"], seen
    assert [(c["host"], c["stack"], c["state"]) for c in seen["containers"]] == [("b", "tiny", "running")]

    done = cluster.sparkctl(cluster.hosts["a"], "down", "tiny")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "host b: removed agents-tiny" in done.stdout
    assert b.docker("ps", "-aq", "--filter", f"label={LABEL_STACK}=tiny").strip() == ""  # b's Docker agrees
    code, seen = cluster.ps()
    assert code == 0 and seen["containers"] == []


def test_check_image_names_the_host_whose_digest_differs(cluster: Cluster, fleet: Hosts, tmp_path: Path) -> None:
    pushed = {}
    for variant in ("v1", "other"):
        (tmp_path / "f").write_text(variant)
        subprocess.run(["tar", "-cf", str(tmp_path / f"{variant}.tar"), "-C", str(tmp_path), "f"], check=True)
        local_tag = f"sparkctl-drift-{fleet.run_id}:{variant}"
        subprocess.run(["docker", "import", str(tmp_path / f"{variant}.tar"), local_tag], check=True,
                       capture_output=True)
        pushed[variant] = fleet.registry.push(local_tag, f"drift:{variant}")
        subprocess.run(["docker", "rmi", local_tag], check=True, capture_output=True)
    ref = f"{fleet.registry.bridge_host}/drift:v1"
    for name in "ab":
        fleet[name].docker("pull", ref)
    fleet["c"].docker("pull", f"{fleet.registry.bridge_host}/drift:other")
    fleet["c"].docker("tag", f"{fleet.registry.bridge_host}/drift:other", ref)  # same tag, other image

    done = cluster.sparkctl(cluster.hosts["a"], "check-image", ref, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert list(verdict["differences"]) == ["c"] and verdict["expected"] == pushed["v1"]
    assert pushed["other"][:19] in verdict["differences"]["c"] and "a, b have" in verdict["differences"]["c"]
    shown = cluster.sparkctl(cluster.hosts["a"], "check-image", ref)
    assert shown.returncode == 1 and "host c" in shown.stdout and "host a" not in shown.stdout

    pulled = cluster.sparkctl(cluster.hosts["a"], "check-image", f"{ref.split(':v1')[0]}@{pushed['v1']}", "--pull")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr  # every agent pulled it by digest


def test_a_killed_host_is_named_and_after_rejoin_runs_one_agent(cluster: Cluster, fleet_sim: str) -> None:
    c = cluster.hosts["c"]
    c.kill()
    try:
        began = time.monotonic()
        code, seen = cluster.ps()
        assert code == 1 and list(seen["unreachable"]) == ["c"], seen
        assert time.monotonic() - began < RAY_TIMEOUT
        down = cluster.sparkctl(cluster.hosts["a"], "down", "tiny")
        assert down.returncode == 1 and "host c could not be reached" in down.stdout, down.stdout + down.stderr
    finally:
        c.start()
    cluster.join(c)
    run_labelled(c, fleet_sim, "again")
    code, seen = cluster.ps()
    assert code == 0, seen
    assert [(r["host"], r["stack"]) for r in seen["containers"]] == [("c", "again")]
    assert len(agent_processes(c)) == 1
    assert cluster.sparkctl(cluster.hosts["a"], "down", "again").returncode == 0


def agent_processes(host: Host) -> list[int]:
    """The pids in `host`'s namespace whose title is the agent actor's (`ray::HostAgent...`)."""
    found = []
    for pid in host.pids():
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::HostAgent"):
                found.append(pid)
        except OSError:
            continue
    return found
