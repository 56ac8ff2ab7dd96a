"""The fleet harness itself: namespace hosts that are isolated, run their own dockerd, pull from
the bridge-side registry, serve an engine the root namespace and the other hosts reach, go down
when their processes are killed and come back, and leave nothing behind even when a test fails.

These are the slow-ish checks the fleet and multi-node tests build on (about 15 s in all, most of
it loading the sim image into the hosts once per session)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from sparkctl.deploy.health import http_status
from tests.fleet import hosts as hosts_module
from tests.fleet import network
from tests.fleet.hosts import Hosts
from tests.fleet.images import keep, load
from tests.fleet.network import HarnessError


def inside(netns: str, *command: str) -> str:
    """Run a command in a host's network namespace only (as a process of that "Spark")."""
    done = subprocess.run(["nsenter", f"--net={network.NETNS_DIR / netns}", *command],
                          capture_output=True, text=True, timeout=30, check=True)
    return done.stdout


def complete(url: str) -> dict:
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4}).encode()
    request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_each_host_is_a_namespace_with_one_link_and_no_way_out(fleet):
    addresses = [h.address for h in fleet]
    assert len(set(addresses)) == 3 and all(ipaddress.ip_address(a) in fleet.network.subnet
                                            for a in addresses)
    for host in fleet:
        links = {link["ifname"] for link in json.loads(inside(host.netns, "ip", "-j", "link", "show"))}
        assert links == {"lo", network.LINK}
        assert "default" not in inside(host.netns, "ip", "route", "show")
        unreachable = subprocess.run(["ip", "-n", host.netns, "route", "get", "192.0.2.1"],
                                     capture_output=True, text=True)  # a lookup only: nothing is sent
        assert unreachable.returncode != 0 and "unreachable" in unreachable.stderr
        assert json.loads(host.docker("info", "--format", "{{json .Name}}")) == host.hostname
        marker = f"{fleet.tag}-{host.name}"  # its own /dev/shm: invisible to the machine's
        on_host = subprocess.run([*host.enter(), "sh", "-c", f"hostname; touch /dev/shm/{marker}; ls /dev/shm"],
                                 capture_output=True, text=True, check=True).stdout.split()
        # (other files may be there: the real vLLM ranks of test_groups leave torch's psm_* segments)
        assert on_host[0] == host.hostname and marker in on_host[1:] and not (Path("/dev/shm") / marker).exists()
        assert json.loads(host.docker("info", "--format", "{{json .DockerRootDir}}")) == str(host.root / "docker")


def test_a_host_pulls_by_digest_from_the_registry_through_the_bridge(fleet, tiny_image):
    digest = fleet.registry.push(tiny_image("fleet-pull"), "fleet/tiny:v1")
    ref = f"{fleet.registry.bridge_host}/fleet/tiny@{digest}"
    fleet["b"].docker("pull", "-q", ref)
    assert ref in json.loads(fleet["b"].docker("image", "inspect", "--format", "{{json .RepoDigests}}", ref))
    fleet["b"].docker("rmi", ref)


def test_an_engine_on_host_b_answers_the_root_namespace_and_host_a(fleet, start_on):
    b = fleet["b"]
    engine = start_on(b)
    engine.wait_ready()
    assert complete(engine.url)["usage"]["completion_tokens"] == 4  # from the root side, via the bridge
    assert inside(fleet["a"].netns, "python3", "-c", f"import urllib.request as u; "
                  f"print(u.urlopen('{engine.url}/health', timeout=5).status)").strip() == "200"
    seen = b.docker("exec", engine.id, "sh", "-c", "ls /sys/class/net; hostname").split()
    assert seen == ["cx7", "lo", b.hostname]
    assert http_status(f"http://{fleet['a'].address}:8000/health") is None  # nothing on host a's port


def test_killing_a_hosts_processes_takes_it_down_and_start_brings_it_back(fleet, start_on):
    c = fleet["c"]
    engine = start_on(c, name="doomed")
    engine.wait_ready()
    assert len(c.pids()) >= 4  # containerd, dockerd, the shim, the engine

    c.kill()
    assert c.pids() == [] and not c.answers()
    assert http_status(engine.url + "/health") is None

    c.start()
    assert c.docker("ps", "-a", "--format", "{{.Names}} {{.State}}").split() == ["doomed", "exited"]
    c.docker("start", "doomed")
    engine.wait_ready()


def test_cleanup_leaves_nothing_behind_when_the_test_fails(fleet, fleet_sim, image_cache):
    with pytest.raises(RuntimeError, match="the test failed"), Hosts(2) as doomed:  # noqa: PT012
        a = doomed["a"]
        load([a], fleet_sim, cache=image_cache)  # a container: a shim, a cgroup, overlay mounts
        a.docker("run", "-d", "--network", "host", "--entrypoint", "sleep", fleet_sim, "600")
        assert a.pids() and network.namespaces(doomed.tag) and _mounts(a.pids()[0], doomed.root)
        raise RuntimeError("the test failed")

    assert network.namespaces(doomed.tag) == [] and network.links(doomed.tag) == []
    assert hosts_module.cgroups(doomed.tag) == [] and hosts_module._naming(doomed.root) == []
    assert not doomed.root.exists() and not _mounts("self", doomed.root)
    assert all(h.answers() for h in fleet) and len(network.namespaces(fleet.tag)) == 3  # others untouched


def test_a_kept_image_seeds_a_new_hosts_data_root(fleet, fleet_sim, tmp_path):
    """How the vLLM CPU image skips its ~110 s load per host, on the sim image: kept from a host
    that loaded it, the seed gives a new host the image before its dockerd starts; containers run
    from the linked layers, and what they change reaches neither the seed nor the host it came from."""
    seed = tmp_path / "seed"
    keep(fleet["a"], fleet_sim, seed)
    with Hosts(1, seeds={"a": seed}) as seeded:
        a = seeded["a"]
        assert a.timings["seed"] < 30 and fleet_sim in a.docker("images", "--format", "{{.Repository}}:{{.Tag}}")
        changed = "echo > /etc/debian_version && rm /etc/os-release && cat /etc/debian_version /etc/os-release"
        done = subprocess.run(["docker", "-H", a.docker_url, "run", "--rm", "--entrypoint", "sh", fleet_sim, "-c",
                               changed], capture_output=True, text=True)
        assert done.returncode == 1 and "No such file" in done.stderr  # its own upper layer
    with Hosts(1, seeds={"a": seed}) as again:
        for host in (fleet["a"], again["a"]):
            assert "PRETTY_NAME" in host.docker("run", "--rm", "--entrypoint", "cat", fleet_sim, "/etc/os-release")


def test_a_machine_without_root_fails_with_what_to_do(monkeypatch):
    monkeypatch.setattr(hosts_module.os, "geteuid", lambda: 1000)
    with pytest.raises(HarnessError, match="run them as root"):
        Hosts(2).__enter__()


def _mounts(pid: int | str, root: Path) -> list[str]:
    text = Path(f"/proc/{pid}/mountinfo").read_text()
    return [line for line in text.splitlines() if str(root) in line]
