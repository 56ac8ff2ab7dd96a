"""The fleet's pure parts: the inventory and its loader (fuzzed), the address checks, the `ray
start` command line and environment, the status join, and stopping processes by session."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkctl.adapters import processes, raynode
from sparkctl.adapters.ray import RayBackend
from sparkctl.adapters.raynode import health_check, ray_environment, start_command
from sparkctl.errors import SparkctlError, SpecError
from sparkctl.fleet import local, membership, survey
from sparkctl.node import Node, NodeLaunch, NodeState
from sparkctl.spec.fleet import GIB, load_fleet
from tests.conftest import wait_for
from tests.teardown import stop

GOOD = """head: a
hosts:
  - name: a
    serving: {interface: enp1s0f0np0, address: 192.168.100.10}
    memory: 110GiB
    ray: {address: 192.168.100.10, port: 6379}
  - name: b
    serving: {interface: enp1s0f0np0, address: 192.168.100.11}
    memory: 90%
    ray: {address: 192.168.100.11}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_the_inventory_loads(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, GOOD))
    assert fleet.names == ["a", "b"] and fleet.head_host.ray.endpoint == "192.168.100.10:6379"
    assert fleet.host("a").memory_bytes(128 * GIB) == 110 * GIB
    assert fleet.host("b").memory_bytes(100 * GIB) == 90 * GIB


@pytest.mark.parametrize(("change", "key", "words"), [
    (("memory: 110GiB", "memory: 110"), "hosts.0.memory", "write GiB"),
    (("memory: 90%", "memory: 190%"), "hosts.1.memory", "at most 100%"),
    (("ray: {address: 192.168.100.11}", "ray: {address: spark-b}"), "hosts.1.ray.address", "not an IP address"),
    (("head: a", "head: c"), "(top level)", "head 'c' is not one of the hosts"),
    (("name: b", "name: a"), "(top level)", "listed more than once"),
    (("    memory: 90%", "    memory: 90%\n    dokcer: x"), "hosts.1.dokcer", "allowed here: docker, memory"),
])
def test_inventory_errors_name_file_and_key(tmp_path: Path, change: tuple[str, str], key: str, words: str) -> None:
    path = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(SpecError) as caught:
        load_fleet(path)
    assert caught.value.file == str(path) and caught.value.key == key and words in caught.value.problem


def test_nodes_on_one_machine_need_apart_ports(tmp_path: Path) -> None:
    text = GOOD.replace("192.168.100.10", "127.0.0.2").replace("192.168.100.11", "127.0.0.3")
    with pytest.raises(SpecError, match="on one machine .loopback. with Ray ports 6379 and 6379"):
        load_fleet(write(tmp_path, text))
    apart = text.replace("ray: {address: 127.0.0.3}", "ray: {address: 127.0.0.3, port: 6700}")
    assert load_fleet(write(tmp_path, apart)).host("b").ray.port == 6700


def test_a_missing_inventory_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no fleet inventory here"):
        load_fleet(tmp_path / "fleet.yaml")


KEYS = ["hosts", "head", "name", "serving", "interface", "address", "memory", "ray", "port", "docker", "x"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 70_000), st.floats(allow_nan=False),
                    st.text(max_size=12), st.sampled_from(["a", "127.0.0.2", "10GiB", "50%", "lo", "::1"]))
values = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.sampled_from(KEYS), kids, max_size=4)), max_leaves=14)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(values, st.text(max_size=200)))
def test_the_loader_fuzzed(tmp_path: Path, doc: object) -> None:
    """Whatever the file holds, it loads or fails with a SpecError naming it."""
    path = write(tmp_path, doc if isinstance(doc, str) else json.dumps(doc, default=str))
    try:
        load_fleet(path)
    except SpecError as e:
        assert str(e).startswith(str(path)), e


def test_addresses_are_checked_by_the_kernel() -> None:
    assert local.is_local("127.0.0.1") and local.is_local("127.0.0.3")
    assert not local.is_local("192.0.2.1")  # TEST-NET-1: on no interface here
    with pytest.raises(SparkctlError, match="not an address of this machine's interfaces"):
        local.check_local("192.0.2.1", "Ray address")


def test_the_host_is_the_local_one(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, GOOD))
    assert local.choose_host(fleet, name=None, address=None, port=None, local=lambda a: a.endswith(".11")).name == "b"
    with pytest.raises(SparkctlError, match="no host of the fleet file"):
        local.choose_host(fleet, name=None, address=None, port=None, local=lambda a: False)
    with pytest.raises(SparkctlError, match="several hosts"):
        local.choose_host(fleet, name=None, address=None, port=None, local=lambda a: True)
    moved = local.choose_host(fleet, name="a", address="127.0.0.2", port=7000)
    assert (moved.name, moved.ray.endpoint) == ("a", "127.0.0.2:7000")
    with pytest.raises(SparkctlError, match="no fleet inventory and no --address"):
        local.choose_host(None, name=None, address=None, port=None)


@pytest.mark.parametrize(("text", "ok"), [("10.0.0.1:6379", True), ("[::1]:6379", True), ("spark-a:6379", False),
                                          ("10.0.0.1", False), ("10.0.0.1:70000", False)])
def test_head_endpoints_are_literal(text: str, ok: bool) -> None:
    if ok:
        assert membership.endpoint(text) == text
    else:
        with pytest.raises(SparkctlError, match="not ADDR:PORT"):
            membership.endpoint(text)


def launch(head: str | None) -> NodeLaunch:
    return NodeLaunch(host="a", address="10.0.0.1", port=6379, head=head, memory_bytes=2 * GIB,
                      temp_dir=Path("/s/fleet/ray"), log_file=Path("/s/fleet/log"), object_store_bytes=100 << 20,
                      labels={"sparkctl.dev/serving-interface": "enp1"}, dead_after=3.0)


def test_the_head_command_leaves_nothing_to_ray() -> None:
    command = start_command(launch(None), ray=["/v/bin/ray"])
    assert "--head" in command and "--port=6379" in command and "--node-ip-address=10.0.0.1" in command
    assert "--include-dashboard=false" in command and "--disable-usage-stats" in command
    assert "--include-log-monitor=false" in command
    assert "--temp-dir=/s/fleet/ray" in command and '--resources={"spark:a": 1}' in command
    assert "--node-manager-port=6380" in command and "--max-worker-port=6634" in command
    assert f"--memory={2 * GIB}" in command
    assert "--labels=sparkctl.dev/host=a,sparkctl.dev/serving-interface=enp1" in command
    assert f"--system-config={json.dumps(health_check(3.0))}" in command
    assert not any("token" in part.lower() for part in command)


def test_a_worker_joins_the_head_it_is_given() -> None:
    command = start_command(launch("10.0.0.9:6379"), ray=["ray"])
    assert "--address=10.0.0.9:6379" in command and "--head" not in command
    assert not any(part.startswith(("--system-config", "--port=")) for part in command)


STAND_IN_RAY = """#!/bin/sh
echo "start $*" >> "$0.calls"
if [ ! -e "$0.missed" ]; then
  touch "$0.missed"
  echo "Exception: The current node timed out during startup. This could happen because ..."
  exit 1
fi
[ -e "$0.fail-again" ] && { echo "Exception: The current node timed out during startup."; exit 1; }
exit 0
"""


@pytest.mark.parametrize("again", [False, True], ids=["then registers", "misses twice"])
def test_a_start_that_missed_rays_registration_wait_is_tried_once_more(tmp_path: Path, again: bool,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raynode, "_check_ports", lambda launch: None)  # the stand-in binds none
    short = Path(tempfile.mkdtemp(prefix="spr", dir="/tmp"))  # Ray's unix sockets live under its temp dir
    ray_bin = tmp_path / "ray"
    ray_bin.write_text(STAND_IN_RAY)
    ray_bin.chmod(0o755)
    if again:
        (tmp_path / "ray.fail-again").touch()
    backend = RayBackend(token_file=tmp_path / "token", timeout=10, namespace="t")
    backend.launcher = [str(ray_bin)]
    here = NodeLaunch(host="a", address="127.0.0.1", port=47000, head=None, memory_bytes=GIB,
                      temp_dir=short / "r", log_file=tmp_path / "ray-start.log", object_store_bytes=100 << 20)
    try:
        if again:
            with pytest.raises(SparkctlError, match=r"(?s)exited with 1 \(2 attempt\(s\)\).*timed out during startup"):
                backend.start_node(here)
        else:
            assert backend.start_node(here).host == "a"
    finally:
        shutil.rmtree(short)
    assert len((tmp_path / "ray.calls").read_text().splitlines()) == 2


def test_ray_children_get_the_token_path_and_nothing_stale() -> None:
    env = ray_environment(Path("/s/fleet/ray-token"), {"RAY_ADDRESS": "10.9.9.9:6379", "RAY_AUTH_TOKEN": "x", "A": "1"})
    assert env == {"A": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/s/fleet/ray-token",
                   "RAY_USAGE_STATS_ENABLED": "0", "RAY_enable_metrics_collection": "0",
                   "RAY_memory_monitor_refresh_ms": "0"}


def test_the_token_is_private(tmp_path: Path) -> None:
    token = tmp_path / "fleet" / "ray-token"
    local.ensure_token(token)
    first = token.read_text()
    local.ensure_token(token)  # kept, not replaced
    assert token.read_text() == first and len(first) == 64 and token.stat().st_mode & 0o777 == 0o600
    token.chmod(0o644)
    with pytest.raises(SparkctlError, match="chmod 600"):
        local.check_token(token)


def test_status_joins_inventory_and_nodes(tmp_path: Path) -> None:
    fleet = load_fleet(write(tmp_path, GOOD))
    nodes = [Node("n1", "192.168.100.10", NodeState.DEAD, {"spark:a": 1}),
             Node("n2", "192.168.100.10", NodeState.ALIVE, {"spark:a": 1, "memory": 110 * GIB}),
             Node("n3", "192.168.100.50", NodeState.ALIVE, {"spark:c": 1})]
    rows = {r.host: r for r in survey.rows(fleet, nodes)}
    assert (rows["a"].state, rows["a"].node_id, rows["a"].memory_gib) == (NodeState.ALIVE, "n2", 110)
    assert rows["b"].state is NodeState.UNKNOWN and "fleet join" in rows["b"].problems[0]
    assert not rows["c"].in_inventory and rows["c"].problems == ("not in the fleet inventory",)
    assert rows["a"].to_dict()["state"] == "alive"


def test_stopping_a_session_reaches_its_processes_only() -> None:
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "time.sleep(60)"
    ours = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # the grandchild starts a moment later
        wait_for(lambda: ours.poll() is not None or len(processes.members(ours.pid)) >= 2, 30, "the grandchild")
        assert ours.poll() is None
        session = processes.recorded(ours.pid)
        restored = processes.Session.from_dict(json.loads(json.dumps(session.to_dict())))
        assert {p.pid for p in processes.alive(restored)} == {p.pid for p in session.procs}
        stopped = processes.stop(restored, grace=5)
        ours.wait(timeout=5)
        assert set(stopped) == {p.pid for p in session.procs} and not processes.alive(restored)
        assert other.poll() is None
    finally:
        stop(other, 0)
        stop(ours, 0)
