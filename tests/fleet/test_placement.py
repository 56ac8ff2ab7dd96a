"""Stacks placed across namespace hosts by Ray and deployed by each host's agent with the
single-Spark pipeline: `sparkctl fleet up | down` run on the head, the engines (the sim) pulled
by digest from the bridge registry and their weights from a Hub on the bridge, on each host.

Host c's ceiling is 0.6 GiB, under what the first three stacks need, so they land on a and b by
memory. Slow (a Ray cluster for the module, ~20 s; every host pulls the sim image once).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.state.store import Store
from tests.fleet.cluster import IMAGE, Cluster, deployable
from tests.fleet.cluster import cluster as start_cluster
from tests.fleet.exposure import check_closed
from tests.fleet.hosts import Hosts

GATEWAY_PORT = 18420  # the head daemon's gateway, on a's address
PORT = 27900
INSTANCE = "fleetplace"
# name: (fraction of a 2 GiB "Spark", engine port, placement)
STACKS = {
    "big-one": (0.6, 8601, {}),
    "big-two": (0.6, 8602, {}),
    "small": (0.35, 8603, {}),
    "huge": (0.95, 8604, {}),
    "trio": (0.2, 8606, {"replicas": 3}),
    "pair": (0.2, 8605, {"replicas": 2}),
    "on-b": (0.18, 8607, {"host": "b"}),
    # An entrypoint wrapper (allowed: the opt-in is for the wrapper, not for what it does) that
    # appends `--host 0.0.0.0` after sparkctl's `--host 127.0.0.1`.
    "wrapped": (0.18, 8608, {},
                {"container": {"entrypoint": ["/bin/sh", "-c", 'exec vllm "$@" --host 0.0.0.0', "wrap"]},
                 "allow": ["entrypoint"]}),
}


@pytest.fixture(scope="module")
def placed(fleet: Hosts, fleet_sim: str, tiny_model_dir: Path, tmp_path_factory) -> Iterator[Cluster]:
    with (deployable(fleet, fleet_sim, tiny_model_dir, tmp_path_factory.mktemp("fleet-stacks"), STACKS) as env,
          start_cluster(fleet, instance=INSTANCE, port=PORT, gateway_port=GATEWAY_PORT, memory={"c": "0.6GiB"},
                        env=env) as made):
        yield made  # the cluster's end removes its containers on every host, and its Ray


def test_stacks_are_placed_across_hosts_by_memory_and_serve_there(placed: Cluster) -> None:
    for stack in ("big-one", "big-two", "small"):
        code, out = placed.up(stack)
        assert code == 0, out
    where = {s: placed.hosts_of(s) for s in ("big-one", "big-two", "small")}
    assert sorted(where["big-one"] + where["big-two"]) == ["a", "b"], where  # 0.6 + 0.6 fits on no one host
    assert where["small"][0] in ("a", "b"), where  # c's 0.6 GiB ceiling is under its 0.7 GiB
    for stack, hosts in where.items():
        (replica,) = placed.book()[stack]["replicas"]
        assert replica["url"].startswith(f"http://{placed.hosts[hosts[0]].address}:")
        outsider = next(h for h in placed.hosts if h.name not in hosts)  # another machine on the LAN
        check_closed(placed, replica["url"], outsider)  # the relay, with the credential only, no dev routes
        containers = placed.hosts[hosts[0]].docker("ps", "-q", "--filter", f"label=sparkctl.stack={stack}").split()
        assert len(containers) == 1, (stack, hosts)

    code, out = placed.up("big-one")  # unchanged: nothing moves, nothing restarts
    assert code == 0 and placed.hosts_of("big-one") == where["big-one"], out

    code, out = placed.up("huge")
    assert code == 1 and "huge fits nowhere in the fleet" in out, out
    assert "free memory per host: a " in out and ", c 0.6 GiB" in out, out
    assert "huge" not in placed.book()

    down = placed.fleet("down", "small")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "small" not in placed.book()
    assert placed.hosts[where["small"][0]].docker("ps", "-aq", "--filter", "label=sparkctl.stack=small").strip() == ""


def test_a_host_whose_image_differs_is_refused_and_nothing_starts(placed: Cluster, fleet: Hosts,
                                                                   fleet_sim: str) -> None:
    other = fleet.registry.push(fleet_sim, "sparkctl-test/fleet-sim:other", labels={"sparkctl.test": "drift"})
    store = Store(placed.root / "c" / "sparkctl.db")  # c pulled the tag once, before it moved
    store.digests.record(f"{IMAGE}:v1", other)

    began = time.monotonic()
    code, out = placed.up("trio")
    assert code == 1, out
    assert "host c: image " + other[:19] in out and "where a, b have sha256:" in out, out
    assert "host a:" not in out and "host b:" not in out
    for host in placed.hosts:
        assert host.docker("ps", "-aq", "--filter", "label=sparkctl.stack=trio").strip() == "", host.name
    assert "trio" not in placed.book()
    print(f"\ndrift refused in {time.monotonic() - began:.1f} s")


def test_replicas_go_to_different_hosts_and_a_named_host_is_kept(placed: Cluster) -> None:
    code, out = placed.up("pair")
    assert code == 0, out
    pair = placed.hosts_of("pair")
    assert len(set(pair)) == 2, pair  # STRICT_SPREAD
    code, out = placed.up("on-b")
    assert code == 0 and placed.hosts_of("on-b") == ["b"], out


def test_an_engine_that_listens_beyond_loopback_is_removed_whatever_its_flags_said(placed: Cluster) -> None:
    """Its argv holds sparkctl's `--host 127.0.0.1`, so the placement check passes it; the kernel
    says the engine listens on 0.0.0.0, so its host's agent removes it and `fleet up` fails naming
    the address and port (its bundle stays reserved, as for any engine that fails to start)."""
    code, out = placed.up("wrapped")
    assert code == 1 and re.search(r"stack wrapped on host \w: its engine listens beyond loopback on "
                                   r"0\.0\.0\.0:8608 \(pid \d+\), so it was removed", out), out
    for host in placed.hosts:
        assert host.docker("ps", "-aq", "--filter", "label=sparkctl.stack=wrapped").strip() == "", host.name
    assert placed.book()["wrapped"]["replicas"] == []  # nothing for the gateway to route to
