"""One model across two namespace hosts: a multi-node stack (`parallel: {tensor: 2, nodes: 2}`)
placed by Ray, one rank per host with its own host's interface and address, served through the
head daemon's gateway; then each of the health lies (issue 18) under a client loop: rank 1's
container killed, rank 0's container killed, rank 1's link taken down. Each time the group's
probe takes it out of routing within 5 s, the group is recreated whole, and no rank is left over
on any host. Requests that reach rank 0 between the fault and the probe get its 500 (the lie
itself); from the ejection on, they wait in the gateway's hold and none fails.

Host a (the head) is too small for a rank, so the ranks run on b and c and a downed link never
cuts the head off; Ray re-places a rank whose host it declared dead once that host rejoins. Slow
(a Ray cluster and three group recreations: about two minutes, printed).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.cluster import Cluster
from tests.fleet.head import FAULTS, HeadDaemon, Load, headed, inject
from tests.fleet.hosts import Hosts
from tests.fleet.network import LINK

PORT = 28800
GATEWAY_PORT = 18700
STACKS = {"duo": (0.2, 8901, {}, {"parallel": {"tensor": 2, "nodes": 2}})}
DETECT_WITHIN = 5.0


@pytest.fixture(scope="module")
def head(fleet: Hosts, fleet_sim: str, tiny_model_dir: Path, tmp_path_factory) -> Iterator[tuple[Cluster, HeadDaemon]]:
    with headed(fleet, fleet_sim, tiny_model_dir, tmp_path_factory.mktemp("group-stacks"), STACKS,
                instance="fleetgroup", port=PORT, gateway_port=GATEWAY_PORT, up=("duo",),
                memory={"a": "0.3GiB"}) as served:  # the group's ranks on b and c: the head's link stays up
        yield served


def ranks(cluster: Cluster) -> dict[str, list[dict]]:
    """Each host's duo containers, as its Docker reports them (state, rank, command, env)."""
    found = {}
    for host in cluster.hosts:
        ids = host.docker("ps", "-aq", "--filter", "label=sparkctl.stack=duo").split()
        found[host.name] = [json.loads(host.docker("inspect", i))[0] for i in ids]
    return found


def test_each_rank_runs_on_its_own_host_with_that_hosts_network(head) -> None:
    cluster, _ = head
    hosts = cluster.book()["duo"]["ranks"]
    assert len(set(hosts)) == 2
    seen = ranks(cluster)
    for index, name in enumerate(hosts):
        (container,) = seen[name]
        config = container["Config"]
        env = dict(e.split("=", 1) for e in config["Env"])
        assert config["Labels"]["sparkctl.rank"] == str(index) and container["HostConfig"]["Init"] is True
        assert env["VLLM_HOST_IP"] == cluster.hosts[name].address and env["GLOO_SOCKET_IFNAME"] == LINK
        command = config["Cmd"]
        assert command[command.index("--node-rank") + 1] == str(index)
        assert command[command.index("--master-addr") + 1] == cluster.hosts[hosts[0]].address
        assert ("--headless" in command) == (index > 0)


@pytest.mark.parametrize("fault", FAULTS)
def test_a_health_lie_is_caught_and_the_group_recreated(head, fault: str) -> None:
    cluster, daemon = head
    load = Load(daemon.url, ["duo"])
    try:
        wait(lambda: load.ok["duo"] >= 3, "the group serves through the gateway", load)
        done = inject(cluster, daemon, fault, "duo")
        served = load.ok["duo"]
        wait(lambda: load.ok["duo"] >= served + 3, "it serves again", load)
    finally:
        load.stop()
    assert all(t <= done.ejected["ejected_at"] for t in load.failed_at["duo"]), (load.failed, done.ejected)
    detected = done.ejected["ejected_at"] - done.began
    assert detected <= DETECT_WITHIN, done.ejected
    assert done.rejoined == (fault == "link down")  # Ray declared it dead: rejoined, and its orphan rank swept
    running = {name: [c for c in found if c["State"]["Running"]] for name, found in ranks(cluster).items()}
    assert sorted(h for h, found in running.items() for _ in found) == sorted(cluster.book()["duo"]["ranks"]), running
    print(f"\n{fault}: caught {detected:.2f} s after the fault ({done.ejected['why']}); group recreated on "
          f"{cluster.book()['duo']['ranks']}; {load.ok['duo']} requests ok, {len(load.failed['duo'])} failed "
          "before the ejection, none after")


def wait(condition, what: str, load: Load | None, timeout: float = 30) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s; {load.ok if load else ''} " \
                                            f"{load.failed if load else ''}"
        time.sleep(0.05)
