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
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl import instance as instances
from sparkctl.container import LABEL_STACK
from tests.fleet.cluster import RAY_TIMEOUT, Cluster
from tests.fleet.cluster import cluster as start_cluster
from tests.fleet.hosts import Host, Hosts

GATEWAY_PORT = 18410  # the head daemon's gateway, on a's address
PORT = 27600  # every host's first Ray port: each host has its own network namespace
INSTANCE = "fleetagents"


@pytest.fixture(scope="module")
def cluster(fleet: Hosts) -> Iterator[Cluster]:
    with start_cluster(fleet, instance=INSTANCE, port=PORT, gateway_port=GATEWAY_PORT) as made:
        yield made


def ps(cluster: Cluster) -> tuple[int, dict]:
    done = cluster.fleet("ps", "--json", "--wait", "8")
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def run_labelled(host: Host, image: str, stack: str) -> str:
    """A container of this instance's `stack` on `host`, as sparkctl labels its own."""
    return host.docker("run", "-d", "--network", "none", "--label", f"{LABEL_STACK}={stack}", "--label",
                       f"{instances.LABEL}={INSTANCE}", "--name", f"agents-{stack}", "--entrypoint", "sleep", image,
                       "600").strip()


def test_ps_lists_each_hosts_containers_and_down_confirms(cluster: Cluster, fleet_sim: str) -> None:
    b = cluster.hosts["b"]
    assert {h.name: len(agent_processes(h)) for h in cluster.hosts} == {"a": 1, "b": 1, "c": 1}  # each on its host
    run_labelled(b, fleet_sim, "tiny")
    code, seen = ps(cluster)
    assert code == 0 and seen["unreachable"] == {} and seen["hosts"] == ["a", "b", "c"], seen
    assert [(c["host"], c["stack"], c["state"]) for c in seen["containers"]] == [("b", "tiny", "running")]

    done = cluster.fleet("down", "tiny")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "host b: removed agents-tiny" in done.stdout
    assert b.docker("ps", "-aq", "--filter", f"label={LABEL_STACK}=tiny").strip() == ""  # b's Docker agrees
    code, seen = ps(cluster)
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

    done = cluster.fleet("check-image", ref, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = json.loads(done.stdout)
    assert list(verdict["differences"]) == ["c"] and verdict["expected"] == pushed["v1"]
    assert pushed["other"][:19] in verdict["differences"]["c"] and "a, b have" in verdict["differences"]["c"]
    shown = cluster.fleet("check-image", ref)
    assert shown.returncode == 1 and "host c" in shown.stdout and "host a" not in shown.stdout

    pulled = cluster.fleet("check-image", f"{ref.split(':v1')[0]}@{pushed['v1']}", "--pull")
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr  # every agent pulled it by digest


def test_a_killed_host_is_named_and_after_rejoin_runs_one_agent(cluster: Cluster, fleet_sim: str) -> None:
    c = cluster.hosts["c"]
    c.kill()
    try:
        began = time.monotonic()
        code, seen = ps(cluster)
        assert code == 1 and list(seen["unreachable"]) == ["c"], seen
        assert time.monotonic() - began < RAY_TIMEOUT
        down = cluster.fleet("down", "tiny")
        assert down.returncode == 1 and "host c could not be reached" in down.stdout, down.stdout + down.stderr
    finally:
        c.start()
    cluster.join(c)
    run_labelled(c, fleet_sim, "again")
    code, seen = ps(cluster)
    assert code == 0, seen
    assert [(r["host"], r["stack"]) for r in seen["containers"]] == [("c", "again")]
    assert len(agent_processes(c)) == 1
    assert cluster.fleet("down", "again").returncode == 0


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
