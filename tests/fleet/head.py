"""The fleet's head as the failover and group tests and benchmarks drive it: client loops through
the head daemon's gateway with the official `openai` client (`Load`), a whole served fleet
(`headed`), and hosts for a benchmark run outside pytest (`standalone`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from openai import OpenAI

from tests.fakes.registry import SIM_IMAGE
from tests.fakes.tinymodel import cached_model
from tests.fleet.cluster import Cluster, HeadDaemon, cluster, deployable
from tests.fleet.hosts import Hosts
from tests.fleet.images import load as load_image


class Load:
    """One client loop per stack through the gateway, sequential requests, no retries."""

    def __init__(self, url: str, stacks: list[str], *, timeout: float = 180) -> None:
        self.client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout)
        self.ok = {s: 0 for s in stacks}
        self.failed: dict[str, list[str]] = {s: [] for s in stacks}
        self.failed_sent: dict[str, list[float]] = {s: [] for s in stacks}  # when each failed one was sent
        self.slowest = {s: 0.0 for s in stacks}
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(s,), daemon=True) for s in stacks]
        for thread in self.threads:
            thread.start()

    def _loop(self, stack: str) -> None:
        while not self.stopping.is_set():
            began, sent = time.monotonic(), time.time()
            try:
                self.client.chat.completions.create(model=stack, max_tokens=4,
                                                    messages=[{"role": "user", "content": "hi"}])
                self.ok[stack] += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted, with its reason
                self.failed[stack].append(f"{type(e).__name__}: {e}"[:300])
                self.failed_sent[stack].append(sent)
            self.slowest[stack] = max(self.slowest[stack], time.monotonic() - began)
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=200)


@contextmanager
def headed(hosts: Hosts, sim_image: str, model_dir: Path, stacks_dir: Path, stacks: dict[str, tuple], *,
           instance: str, port: int, gateway_port: int, up: tuple[str, ...],
           memory: dict[str, str] | None = None, wait: float = 240,
           daemon_env: dict[str, str] | None = None) -> Iterator[tuple[Cluster, HeadDaemon]]:
    """A fleet on `hosts` serving `stacks` (those in `up` placed with `fleet up`, each given
    `wait` seconds), and the head's daemon; at the end the cluster's containers are removed on every host."""
    with (deployable(hosts, sim_image, model_dir, stacks_dir, stacks) as env,
          cluster(hosts, instance=instance, port=port, gateway_port=gateway_port, memory=memory, env=env,
                  daemon_env=daemon_env) as made):
        for stack in up:
            code, out = made.up(stack, wait=wait)
            assert code == 0, out
        yield made, made.daemon


@contextmanager
def standalone(root: Path) -> Iterator[tuple[Hosts, str, Path]]:
    """For a benchmark run outside pytest: three hosts with the sim image loaded, and the tiny
    model (cached in SPARKCTL_BUILD_CACHE when set); (hosts, sim image, model dir)."""
    with Hosts(3) as hosts:
        os.environ["no_proxy"] = ",".join([*(h.address for h in hosts), hosts.network.gateway])
        load_image(hosts.hosts, SIM_IMAGE, cache=root)
        cache = os.environ.get("SPARKCTL_BUILD_CACHE")
        yield hosts, SIM_IMAGE, cached_model(Path(cache) / "models" if cache else root / "models")


FAULTS = ("worker killed", "rank 0 killed", "link down")  # the three ways a group's /health lies
LINK_DOWN_S = 5.0


@dataclass(frozen=True)
class Fault:
    """One injected fault and what the head's daemon did about it."""

    began: float  # epoch seconds
    victim: str  # the host whose rank failed
    ejected: dict  # the daemon's `fleet_group_ejected` entry
    replaced: dict  # its `fleet_replaced` entry for the recreation
    rejoined: bool  # Ray declared the host dead (its link was down): it was rejoined and swept


def inject(cluster: Cluster, daemon: HeadDaemon, fault: str, stack: str, *,
           caught: Callable[[], None] = lambda: None, recreate_within: float = 180) -> Fault:
    """Break a group as `fault` says, wait for the daemon to take it out of routing (then
    `caught()`), bring a downed link back after LINK_DOWN_S (rejoining the host when Ray declared
    it dead meanwhile, as its owner would), and wait for the recreation."""
    ranks = cluster.book()[stack]["ranks"]
    victim = cluster.hosts[ranks[0] if fault == "rank 0 killed" else ranks[1]]
    seen, replaced = len(daemon.events("fleet_group_ejected")), len(daemon.events("fleet_replaced"))
    began = time.time()
    if fault == "link down":
        cluster.hosts.network.set_link(victim.name, up=False)
    else:
        victim.docker("kill", victim.docker("ps", "-q", "--filter", f"label=sparkctl.stack={stack}").split()[0])
    daemon.until(lambda: len(daemon.events("fleet_group_ejected")) > seen, 30)
    caught()
    rejoined = False
    if fault == "link down":
        time.sleep(max(0.0, began + LINK_DOWN_S - time.time()))
        cluster.hosts.network.set_link(victim.name, up=True)
        if [e for e in daemon.events("fleet_host_ejected") if e["host"] == victim.name and e["ejected_at"] > began]:
            back = len([e for e in daemon.events("fleet_host_back") if e["host"] == victim.name])
            assert cluster.fleet("leave", on=victim.name).returncode == 0
            cluster.join(victim)
            daemon.until(lambda: len([e for e in daemon.events("fleet_host_back") if e["host"] == victim.name]) > back,
                         60)
            rejoined = True
    daemon.until(lambda: len(daemon.events("fleet_replaced")) > replaced, recreate_within)
    return Fault(began, victim.name, daemon.events("fleet_group_ejected")[seen], daemon.events("fleet_replaced")[-1],
                 rejoined)
