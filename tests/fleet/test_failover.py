"""A host dies under load: the daemon on the head (host a, gateway on a's address) ejects its
replicas as soon as Ray declares it dead, re-places its stacks where Ray puts them, and when the
host comes back it is swept, so nothing runs twice. Then an alias switches across hosts, from the
replicated `pair` to `green`, placed where it fits, under the same kind of load.

Host a's ceiling (1 GiB) keeps `solo` (1.2 GiB) on b or c; `pair` has a replica on two hosts.
Clients are the official `openai` client without retries, one loop per stack: `pair` must see no
failed request, and `solo`'s requests wait in the gateway's hold while it has no replica, then
succeed. Slow (a Ray cluster, a host killed and rejoined: about a minute, printed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from sparkctl.deploy.health import http_status
from tests.fleet.cluster import Cluster, deployable
from tests.fleet.cluster import cluster as start_cluster
from tests.fleet.hosts import Hosts

PORT = 28200
GATEWAY_PORT = 18400
INSTANCE = "fleetfail"
STACKS = {"solo": (0.6, 8701, {}), "pair": (0.2, 8702, {"replicas": 2}), "green": (0.2, 8703, {"replicas": 1})}


class HeadDaemon:
    """`sparkctl daemon` on host a, its gateway on a's address."""

    def __init__(self, cluster: Cluster) -> None:
        a = cluster.hosts["a"]
        self.url = f"http://{a.address}:{GATEWAY_PORT}"
        self.log_path = cluster.root / "daemon.log"
        env = cluster.env_for(a) | {"SPARKCTL_GATEWAY_HOST": a.address, "SPARKCTL_GATEWAY_PORT": str(GATEWAY_PORT),
                                    "SPARKCTL_SWITCH_HOLD_TIMEOUT": "150"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([*a.enter(), sys.executable, "-m", "sparkctl", "daemon"], stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while http_status(self.url + "/health") != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()[-3000:]
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

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
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Load:
    """One client loop per stack through the gateway, sequential requests, no retries."""

    def __init__(self, url: str, stacks: list[str]) -> None:
        self.client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=180)
        self.ok = {s: 0 for s in stacks}
        self.failed: dict[str, list[str]] = {s: [] for s in stacks}
        self.slowest = {s: 0.0 for s in stacks}
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(s,), daemon=True) for s in stacks]
        for thread in self.threads:
            thread.start()

    def _loop(self, stack: str) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                self.client.chat.completions.create(model=stack, max_tokens=4,
                                                    messages=[{"role": "user", "content": "hi"}])
                self.ok[stack] += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted, with its reason
                self.failed[stack].append(f"{type(e).__name__}: {e}"[:300])
            self.slowest[stack] = max(self.slowest[stack], time.monotonic() - began)
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=200)


@pytest.fixture(scope="module")
def head(fleet: Hosts, fleet_sim: str, tiny_model_dir: Path, tmp_path_factory) -> Iterator[tuple[Cluster, HeadDaemon]]:
    with (deployable(fleet, fleet_sim, tiny_model_dir, tmp_path_factory.mktemp("failover-stacks"), STACKS) as env,
          start_cluster(fleet, instance=INSTANCE, port=PORT, memory={"a": "1GiB"}, env=env) as made):
        for stack in ("solo", "pair"):
            code, out = made.up(stack)
            assert code == 0, out
        daemon = HeadDaemon(made)
        try:
            yield made, daemon
        finally:
            daemon.stop()
            for stack in STACKS:
                made.fleet("down", stack)


def test_a_dead_host_leaves_routing_its_stack_moves_and_it_comes_back_swept(head) -> None:
    cluster, daemon = head
    solo_host = cluster.hosts_of("solo")[0]
    assert solo_host in ("b", "c") and len(set(cluster.hosts_of("pair"))) == 2
    load = Load(daemon.url, ["solo", "pair"])
    try:
        deadline = time.monotonic() + 30
        while min(load.ok.values()) < 3:  # both stacks answer through the gateway
            assert time.monotonic() < deadline and not any(load.failed.values()), (load.ok, load.failed)
            time.sleep(0.1)
        victim = cluster.hosts[solo_host]
        killed = time.time()
        victim.kill()
        deadline = time.monotonic() + 150
        while cluster.hosts_of("solo") == [solo_host]:
            assert time.monotonic() < deadline, daemon.log()[-4000:]
            time.sleep(0.2)
        served = dict(load.ok)
        deadline = time.monotonic() + 60
        while load.ok["solo"] < served["solo"] + 3:  # the held requests went, and new ones follow
            assert time.monotonic() < deadline, (load.ok, load.failed, daemon.log()[-4000:])
            time.sleep(0.1)
    finally:
        load.stop()
    assert load.failed == {"solo": [], "pair": []}, load.failed
    (ejected,) = [e for e in daemon.events("fleet_host_ejected") if e["host"] == solo_host]
    assert ejected["died_at"] and ejected["after_ray_s"] < 1.0, ejected
    new_host = cluster.hosts_of("solo")[0]
    assert new_host not in (solo_host, "a")
    assert solo_host not in cluster.hosts_of("pair")
    print(f"\nhost {solo_host} killed: Ray declared it dead after {ejected['died_at'] - killed:.2f} s, the gateway "
          f"ejected it {ejected['after_ray_s']:.3f} s later; solo re-placed on {new_host}; slowest held request "
          f"{load.slowest['solo']:.1f} s; {load.ok} requests, none failed")

    victim.start()
    cluster.join(victim)
    deadline = time.monotonic() + 60
    while not [e for e in daemon.events("fleet_host_back") if e["host"] == solo_host]:
        assert time.monotonic() < deadline, daemon.log()[-4000:]
        time.sleep(0.2)
    running = {h.name: h.docker("ps", "-q", "--filter", "label=sparkctl.stack=solo").split() for h in cluster.hosts}
    assert [h for h, ids in running.items() if ids] == [new_host], running  # nothing runs twice


def test_an_alias_switches_across_hosts_without_a_failed_request(head) -> None:
    cluster, daemon = head
    first = cluster.sparkctl(cluster.hosts["a"], "switch", "primary", "pair", timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    load = Load(daemon.url, ["primary"])
    try:
        deadline = time.monotonic() + 30
        while load.ok["primary"] < 5:
            assert time.monotonic() < deadline and not load.failed["primary"], (load.ok, load.failed)
            time.sleep(0.1)
        switched = cluster.sparkctl(cluster.hosts["a"], "switch", "primary", "green", timeout=300)
        assert switched.returncode == 0, switched.stdout + switched.stderr
        after = load.ok["primary"]
        deadline = time.monotonic() + 30
        while load.ok["primary"] < after + 5:
            assert time.monotonic() < deadline, (load.ok, load.failed)
            time.sleep(0.1)
    finally:
        load.stop()
    assert load.failed == {"primary": []}, load.failed
    assert "pair" not in cluster.book() and len(cluster.hosts_of("green")) == 1, daemon.log()[-3000:] + switched.stdout
    for host in cluster.hosts:
        assert host.docker("ps", "-aq", "--filter", "label=sparkctl.stack=pair").strip() == "", host.name
    print(f"\nprimary switched pair -> green on {cluster.hosts_of('green')[0]}: {load.ok['primary']} requests, "
          "none failed")
