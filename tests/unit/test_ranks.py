"""A multi-node stack's ranks (issue 18): the `parallel` section and what it refuses, each rank's
vLLM flags and its own host's network env, the rank's container plan, the ranks the fleet's
inventory gives a group, `sparkctl stacks render --rank`, and the host's refusal of a rank that is
not its own or whose interface does not hold its address."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
from pydantic import ValidationError

from sparkctl.cli.client import DaemonClient
from sparkctl.container import LABEL_RANK, LABEL_RELAY
from sparkctl.errors import SparkctlError, SpecError
from sparkctl.fleet.deploy import group_ranks, rank_on
from sparkctl.fleet.hostagent import HostAgent, placeable
from sparkctl.fleet.local import check_on_interface
from sparkctl.messages import FleetPs
from sparkctl.spec.fleet import Fleet
from sparkctl.spec.load import load_stacks
from sparkctl.spec.models import Parallel, Stack
from sparkctl.spec.ranks import Rank, RankHost, rank_args, rank_env
from sparkctl.spec.render import Sources, render

# A minimal vllm stack, as tests/fleet/cluster.py `stack_file` writes one.
MINIMAL = {"name": "group", "image": {"repository": "ghcr.io/example/vllm", "tag": "v1"},
           "model": {"repo": "google/gemma-4", "revision": "main"}, "vllm": {"port": 8110, "max_model_len": 2048}}
TWO = {"tensor": 2, "nodes": 2}
SOURCES = Sources(model_dir="/hf/models--google--gemma-4")

# Hosts cabled to different CX-7 ports; only b names its RDMA device.
A = RankHost("a", "enp1s0f0np0", "192.168.100.10")
B = RankHost("b", "enp1s0f1np1", "192.168.100.11", "rocep1s0f1")
FLEET = {"head": "a", "hosts": [
    {"name": "a", "serving": {"interface": "enp1s0f0np0", "address": "192.168.100.10"}, "memory": "110GiB",
     "ray": {"address": "192.168.100.10", "port": 6379}},
    {"name": "b", "serving": {"interface": "enp1s0f1np1", "address": "192.168.100.11", "hca": "rocep1s0f1"},
     "memory": "110GiB", "ray": {"address": "192.168.100.11", "port": 6379}},
    {"name": "c", "serving": {"interface": "enp1s0f0np0", "address": "192.168.100.12"}, "memory": "90%",
     "ray": {"address": "192.168.100.12", "port": 6379}},
]}


def stack(**changes: object) -> Stack:
    return Stack.model_validate(MINIMAL | changes)


def load(tmp_path: Path, **changes: object) -> Stack:
    """The stack as its file loads (JSON is YAML), or the loader's SpecError."""
    path = tmp_path / "group.yaml"
    path.write_text(json.dumps(MINIMAL | changes))
    return load_stacks([path]).stack("group")


def refusal(tmp_path: Path, **changes: object) -> SpecError:
    with pytest.raises(SpecError) as caught:
        load(tmp_path, **changes)
    assert caught.value.file == str(tmp_path / "group.yaml")
    return caught.value


def value(args: list[str] | tuple[str, ...], flag: str) -> str:
    assert list(args).count(flag) == 1, f"{flag} given {list(args).count(flag)} times in {args}"
    return args[list(args).index(flag) + 1]


# --- the `parallel` section --------------------------------------------------------------------------
@pytest.mark.parametrize("section", [
    {"tensor": 2, "nodes": 2},
    {"pipeline": 2, "nodes": 2},
    {"data": 2, "nodes": 2},
    {"tensor": 2, "pipeline": 2, "nodes": 4},
    {"tensor": 2, "data": 2, "nodes": 2, "gpus_per_node": 2},
])
def test_a_world_that_uses_every_gpu_loads(tmp_path: Path, section: dict) -> None:
    loaded = load(tmp_path, parallel=section)
    assert loaded.parallel == Parallel(**section)
    assert loaded.parallel.master_port == 29501


def test_a_world_that_is_not_the_gpus_is_refused_naming_both_products(tmp_path: Path) -> None:
    error = refusal(tmp_path, parallel={"tensor": 2, "pipeline": 1, "data": 1, "nodes": 3})
    assert error.key == "parallel"
    assert "tensor x pipeline x data = 2 x 1 x 1 = 2 ranks" in error.problem
    assert "3 nodes x 1 GPU(s) = 3" in error.problem and "must match" in error.problem


def test_gpus_per_node_count_in_the_product(tmp_path: Path) -> None:
    error = refusal(tmp_path, parallel={"tensor": 2, "nodes": 2, "gpus_per_node": 2})
    assert error.key == "parallel" and "= 2 ranks, but 2 nodes x 2 GPU(s) = 4" in error.problem


def test_one_node_is_not_a_group(tmp_path: Path) -> None:
    error = refusal(tmp_path, parallel={"nodes": 1})
    assert error.key == "parallel.nodes" and "greater than or equal to 2" in error.problem


def test_nodes_are_required() -> None:
    with pytest.raises(ValidationError, match="parallel.nodes"):
        stack(parallel={"tensor": 2})


@pytest.mark.parametrize("vllm", [
    {"port": 8110, "tensor_parallel_size": 2},
    {"port": 8110, "distributed_executor_backend": "mp"},
    {"port": 8110, "distributed_executor_backend": "ray"},
])
def test_the_stacks_own_parallel_size_or_backend_is_refused(tmp_path: Path, vllm: dict) -> None:
    error = refusal(tmp_path, vllm=vllm, parallel=TWO)
    assert error.key == "(top level)"
    assert "leave vllm.tensor_parallel_size and vllm.distributed_executor_backend unset" in error.problem


def test_the_same_vllm_settings_load_without_parallel(tmp_path: Path) -> None:
    loaded = load(tmp_path, vllm={"port": 8110, "tensor_parallel_size": 2, "distributed_executor_backend": "mp"})
    assert loaded.parallel is None and loaded.vllm.tensor_parallel_size == 2


@pytest.mark.parametrize("placement", [{"replicas": 2}, {"host": "b"}])
def test_a_group_with_replicas_or_a_named_host_is_refused(tmp_path: Path, placement: dict) -> None:
    error = refusal(tmp_path, placement=placement, parallel=TWO)
    assert error.key == "(top level)"
    assert "one group on `parallel.nodes` different hosts" in error.problem
    assert "no `placement.host` or `placement.replicas`" in error.problem


def test_a_group_with_one_replica_loads(tmp_path: Path) -> None:
    assert load(tmp_path, placement={"replicas": 1}, parallel=TWO).parallel == Parallel(**TWO)


def test_a_compose_stack_with_parallel_is_refused(tmp_path: Path) -> None:
    compose = {"kind": "compose", "vllm": None,
               "compose": {"project": "x", "service": "vllm", "served_model_name": "x", "port": 8111}}
    assert load(tmp_path, **compose).parallel is None  # the same stack without `parallel` is fine
    error = refusal(tmp_path, **compose, parallel=TWO)
    assert error.key == "(top level)" and "`parallel` runs vLLM's multi-node mode: a `vllm` stack only" in error.problem


def test_a_group_parks_by_stopping() -> None:
    assert stack().sleeps
    assert not stack(parallel=TWO).sleeps
    assert not stack(parallel=TWO, switch={"park": "auto"}).sleeps


# --- each rank's flags and env -----------------------------------------------------------------------
def test_only_ranks_above_0_are_headless() -> None:
    assert [Rank(i, A.address, A).headless for i in range(3)] == [False, True, True]


def test_rank_0_serves_with_the_groups_flags() -> None:
    parallel = Parallel(tensor=2, pipeline=2, nodes=4, master_port=29600)
    assert rank_args(parallel, Rank(0, A.address, A)) == [
        "--distributed-executor-backend", "mp", "--nnodes", "4", "--node-rank", "0",
        "--master-addr", "192.168.100.10", "--master-port", "29600",
        "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"]


def test_a_rank_above_0_is_headless_and_names_rank_0_as_master() -> None:
    args = rank_args(Parallel(tensor=2, pipeline=2, nodes=4), Rank(3, A.address, B))
    assert args[-1] == "--headless" and args.count("--headless") == 1
    assert value(args, "--node-rank") == "3" and value(args, "--nnodes") == "4"
    assert value(args, "--master-addr") == "192.168.100.10" and value(args, "--master-port") == "29501"
    assert value(args, "--tensor-parallel-size") == "2" and value(args, "--pipeline-parallel-size") == "2"
    assert value(args, "--distributed-executor-backend") == "mp"


def test_data_parallel_size_only_above_1() -> None:
    assert "--data-parallel-size" not in rank_args(Parallel(tensor=2, nodes=2), Rank(0, A.address, A))
    args = rank_args(Parallel(data=2, nodes=2), Rank(1, A.address, B))
    assert value(args, "--data-parallel-size") == "2" and value(args, "--tensor-parallel-size") == "1"


def test_a_ranks_env_is_its_own_hosts_interface_and_address() -> None:
    assert rank_env(A) == {"VLLM_HOST_IP": "192.168.100.10", "GLOO_SOCKET_IFNAME": "enp1s0f0np0",
                           "NCCL_SOCKET_IFNAME": "enp1s0f0np0", "TP_SOCKET_IFNAME": "enp1s0f0np0",
                           "UCX_NET_DEVICES": "enp1s0f0np0"}


def test_nccl_ib_hca_only_where_the_host_names_one() -> None:
    env = rank_env(B)
    assert env["NCCL_IB_HCA"] == "rocep1s0f1" and env["VLLM_HOST_IP"] == "192.168.100.11"
    assert {env[k] for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "UCX_NET_DEVICES")} == {
        "enp1s0f1np1"}
    assert "NCCL_IB_HCA" not in rank_env(A)


# --- the rank's container ----------------------------------------------------------------------------
def test_a_ranks_plan_has_its_label_init_env_and_flags() -> None:
    plan = render(stack(parallel=TWO), SOURCES, rank=Rank(1, A.address, B))
    assert plan.labels[LABEL_RANK] == "1" and plan.init
    assert {k: plan.env[k] for k in rank_env(B)} == rank_env(B)
    assert plan.command[-len(rank_args(Parallel(**TWO), Rank(1, A.address, B))):] == tuple(
        rank_args(Parallel(**TWO), Rank(1, A.address, B)))
    assert "--init" in shlex.split(plan.docker_run())
    assert "--enable-sleep-mode" not in plan.command and "VLLM_SERVER_DEV_MODE" not in plan.env  # parks by stopping


def test_a_normal_stack_runs_without_init_or_a_rank() -> None:
    plan = render(stack(), SOURCES)
    assert not plan.init and LABEL_RANK not in plan.labels
    assert "--nnodes" not in plan.command and "VLLM_HOST_IP" not in plan.env
    assert "--init" not in shlex.split(plan.docker_run())


def test_a_group_runs_with_init_even_before_its_rank_is_known() -> None:
    plan = render(stack(parallel=TWO), SOURCES)
    assert plan.init and LABEL_RANK not in plan.labels and "--nnodes" not in plan.command


def test_each_rank_gets_its_own_hosts_network_never_anothers() -> None:
    group = stack(parallel=TWO)
    first, second = (render(group, SOURCES, rank=Rank(i, A.address, h)) for i, h in enumerate((A, B)))
    assert first.env["NCCL_SOCKET_IFNAME"] == "enp1s0f0np0" and first.env["VLLM_HOST_IP"] == "192.168.100.10"
    assert second.env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1" and second.env["VLLM_HOST_IP"] == "192.168.100.11"
    assert "enp1s0f1np1" not in first.docker_run() and "rocep1s0f1" not in first.docker_run()
    assert "enp1s0f0np0" not in second.docker_run()
    assert (first.labels[LABEL_RANK], second.labels[LABEL_RANK]) == ("0", "1")
    assert value(first.command, "--master-addr") == value(second.command, "--master-addr") == "192.168.100.10"


def test_the_hosts_network_wins_over_the_stacks_env() -> None:
    group = stack(parallel=TWO, container={"env": {"NCCL_SOCKET_IFNAME": "eth0"}})  # VLLM_HOST_IP: refused at load
    plan = render(group, SOURCES, rank=Rank(1, A.address, B))
    assert plan.env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1" and plan.env["VLLM_HOST_IP"] == "192.168.100.11"


# --- the ranks the inventory gives a group -----------------------------------------------------------
def test_each_host_gets_its_own_serving_entry_and_rank_0s_address_as_master() -> None:
    fleet = Fleet.model_validate(FLEET)
    assert group_ranks(fleet, ["b", "a", "c"]) == {
        "b": {"index": 0, "master": "192.168.100.11",
              "host": {"name": "b", "interface": "enp1s0f1np1", "address": "192.168.100.11", "hca": "rocep1s0f1"}},
        "a": {"index": 1, "master": "192.168.100.11",
              "host": {"name": "a", "interface": "enp1s0f0np0", "address": "192.168.100.10", "hca": None}},
        "c": {"index": 2, "master": "192.168.100.11",
              "host": {"name": "c", "interface": "enp1s0f0np0", "address": "192.168.100.12", "hca": None}},
    }


def test_rank_on_is_the_ranks_own_host() -> None:
    fleet = Fleet.model_validate(FLEET)
    assert rank_on(fleet, ["a", "b"], 1) == Rank(1, "192.168.100.10", B)
    assert rank_on(fleet, ["a", "b"], 0) == Rank(0, "192.168.100.10", A)
    assert rank_on(fleet, ["b", "a"], 1) == Rank(1, "192.168.100.11", A)


def test_a_group_needs_the_fleet_file() -> None:
    with pytest.raises(SparkctlError, match="a multi-node stack needs the fleet file"):
        group_ranks(None, ["a", "b"])


def test_a_host_the_inventory_lacks_is_named() -> None:
    with pytest.raises(SpecError, match="no host named 'z'"):
        group_ranks(Fleet.model_validate(FLEET), ["a", "z"])


# --- `sparkctl stacks render --rank` -----------------------------------------------------------------
def fleet_yaml(hosts: list[dict]) -> str:
    return json.dumps({"hosts": hosts})


@pytest.fixture
def group_workspace(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The workspace with a two-rank stack `group` and a fleet file of hosts a, b, c."""
    (workspace / "stacks" / "group.yaml").write_text(json.dumps(MINIMAL | {"parallel": TWO}))
    (workspace / "fleet.yaml").write_text(fleet_yaml(FLEET["hosts"]))
    monkeypatch.setenv("SPARKCTL_FLEET_FILE", str(workspace / "fleet.yaml"))
    return workspace


def test_render_rank_1_is_headless_on_the_second_host(group_workspace: Path, cli) -> None:
    code, out, err = cli("stacks", "render", "group", "--rank", "1")
    assert code == 0, err
    args = shlex.split(out)
    assert "--headless" in args and value(args, "--node-rank") == "1" and value(args, "--nnodes") == "2"
    assert value(args, "--master-addr") == "192.168.100.10" and "--init" in args
    assert {"NCCL_SOCKET_IFNAME=enp1s0f1np1", "VLLM_HOST_IP=192.168.100.11", "NCCL_IB_HCA=rocep1s0f1",
            f"{LABEL_RANK}=1"} <= set(args)
    assert "enp1s0f0np0" not in out


def test_the_shipped_example_group_renders_its_rank_1(group_workspace: Path, cli) -> None:
    """stacks/qwen36-bf16-2node.yaml, the multi-node stack an owner copies: rank 1 of BF16 Qwen at
    tensor parallel 2, headless on the fleet file's second host."""
    code, out, err = cli("stacks", "render", "qwen36-bf16-2node", "--rank", "1")
    assert code == 0, err
    args = shlex.split(out)
    assert "--headless" in args and value(args, "--node-rank") == "1" and value(args, "--tensor-parallel-size") == "2"
    assert value(args, "--master-addr") == "192.168.100.10" and "VLLM_HOST_IP=192.168.100.11" in args
    assert "/model:ro" in out and "Qwen3.6-27B-AEON-Ultimate-Uncensored-BF16" in out


def test_render_rank_0_serves_on_the_first_host(group_workspace: Path, cli) -> None:
    code, out, err = cli("stacks", "render", "group", "--rank", "0", "--format", "json")
    assert code == 0, err
    plan = json.loads(out)
    assert "--headless" not in plan["command"] and value(plan["command"], "--node-rank") == "0"
    assert plan["env"]["GLOO_SOCKET_IFNAME"] == "enp1s0f0np0" and plan["env"]["VLLM_HOST_IP"] == "192.168.100.10"
    assert "NCCL_IB_HCA" not in plan["env"] and plan["labels"][LABEL_RANK] == "0" and plan["init"] is True


def test_render_without_rank_has_no_rank_flags(group_workspace: Path, cli) -> None:
    code, out, _ = cli("stacks", "render", "group")
    assert code == 0 and "--node-rank" not in out and "NCCL_SOCKET_IFNAME" not in out and "--init" in out


def test_render_takes_the_fleet_file_in_the_state_dir(workspace: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKCTL_FLEET_FILE", raising=False)
    (workspace / "stacks" / "group.yaml").write_text(json.dumps(MINIMAL | {"parallel": TWO}))
    (workspace / "state").mkdir(exist_ok=True)
    (workspace / "state" / "fleet.yaml").write_text(fleet_yaml(FLEET["hosts"]))
    code, out, err = cli("stacks", "render", "group", "--rank", "1")
    assert code == 0, err
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1" in out and "--headless" in out


def test_render_follows_the_hosts_the_group_was_placed_on(group_workspace: Path, cli,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a group was placed is the head's daemon's to say (it owns the book): the CLI asks it."""
    asked = []

    def post(client: DaemonClient, path: str, body: dict) -> dict:
        asked.append((path, body))
        return dataclasses.asdict(FleetPs(hosts=(), placed={"group": ("c", "a")}))

    monkeypatch.setattr(DaemonClient, "available", lambda client: True)
    monkeypatch.setattr(DaemonClient, "post", post)
    code, out, err = cli("stacks", "render", "group", "--rank", "1")
    assert code == 0, err
    assert asked == [("/v1/fleet/ps", {"book_only": True})]
    args = shlex.split(out)
    assert value(args, "--master-addr") == "192.168.100.12" and "VLLM_HOST_IP=192.168.100.10" in args
    assert "NCCL_SOCKET_IFNAME=enp1s0f0np0" in args and "enp1s0f1np1" not in out


def test_render_rank_of_a_stack_without_parallel_names_the_key(group_workspace: Path, cli) -> None:
    code, _, err = cli("stacks", "render", "qwen36-dflash", "--rank", "0")
    assert code == 1 and "qwen36-dflash" in err and ": parallel: not a multi-node stack" in err


def test_render_a_rank_that_does_not_exist_names_the_key(group_workspace: Path, cli) -> None:
    code, _, err = cli("stacks", "render", "group", "--rank", "2")
    assert code == 1 and "group.yaml: parallel.nodes: rank 2 does not exist: ranks 0 to 1" in err
    code, _, err = cli("stacks", "render", "group", "--rank", "-1")
    assert code == 2


def test_render_a_rank_the_fleet_file_has_no_host_for(group_workspace: Path, cli) -> None:
    (group_workspace / "fleet.yaml").write_text(fleet_yaml(FLEET["hosts"][:1]))
    code, _, err = cli("stacks", "render", "group", "--rank", "1")
    assert code == 1 and "fleet.yaml: hosts: rank 1 needs 2 hosts; there are 1" in err


def test_render_without_a_fleet_file_shows_placeholders(group_workspace: Path, cli,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_FLEET_FILE", str(group_workspace / "no-such-fleet.yaml"))
    code, out, err = cli("stacks", "render", "group", "--rank", "1", "--format", "json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["env"]["NCCL_SOCKET_IFNAME"] == "<its serving interface>"
    assert plan["env"]["VLLM_HOST_IP"] == "<its serving address>"
    assert value(plan["command"], "--master-addr") == "<rank 0's serving address>" and "--headless" in plan["command"]


# --- the host's refusal ------------------------------------------------------------------------------
def agent(host: str) -> HostAgent:
    return HostAgent(host=host, docker_url=None, instance="test-ranks")  # Docker is reached on first use only


def test_a_rank_for_another_host_is_refused() -> None:
    ranks = group_ranks(Fleet.model_validate(FLEET), ["a", "b"])
    with pytest.raises(SparkctlError, match="rank 1 is for host b, not a"):
        agent("a")._rank(ranks["b"])


def test_a_rank_on_this_host_with_its_interface_is_taken() -> None:
    loopback = {"hosts": [{"name": "a", "serving": {"interface": "lo", "address": "127.0.0.1"}, "memory": "90%",
                           "ray": {"address": "127.0.0.1", "port": 6379}},
                          {"name": "b", "serving": {"interface": "lo", "address": "127.0.0.2"}, "memory": "90%",
                           "ray": {"address": "127.0.0.2", "port": 6700}}]}
    ranks = group_ranks(Fleet.model_validate(loopback), ["a", "b"])
    assert agent("a")._rank(ranks["a"]) == Rank(0, "127.0.0.1", RankHost("a", "lo", "127.0.0.1"))


def test_a_rank_whose_interface_does_not_hold_its_address_is_refused() -> None:
    data = {"index": 0, "master": "10.255.255.1", "host": {"name": "a", "interface": "lo", "address": "10.255.255.1"}}
    with pytest.raises(SparkctlError, match="interface lo holds .*127.0.0.1.*, not 10.255.255.1"):
        agent("a")._rank(data)


def test_an_absent_interface_is_refused_naming_it() -> None:
    with pytest.raises(SparkctlError, match="serving interface 'nosuch0' does not exist here"):
        check_on_interface("nosuch0", "127.0.0.1", "a")


def test_an_interface_that_does_not_hold_the_address_is_refused_naming_what_it_holds() -> None:
    with pytest.raises(SparkctlError) as caught:
        check_on_interface("lo", "10.255.255.1", "a")
    message = str(caught.value)
    assert message.startswith("host a: interface lo holds ") and "127.0.0.1" in message
    assert "not 10.255.255.1" in message and "fix `serving` for a in the fleet file" in message


def test_the_interface_that_holds_the_address_passes() -> None:
    check_on_interface("lo", "127.0.0.1", "a")


def test_rank_0_listens_on_loopback_and_is_relayed_the_other_ranks_serve_no_http(group_workspace: Path, cli) -> None:
    """A placed engine never listens beyond its host's loopback: its host's agent relays rank 0's
    port (the label) to the head's gateway; headless ranks have nothing to relay."""
    for rank, relayed in (("0", True), ("1", False)):
        code, out, err = cli("stacks", "render", "group", "--rank", rank, "--format", "json")
        assert code == 0, err
        plan = json.loads(out)
        assert value(plan["command"], "--host") == "127.0.0.1"
        assert (plan["labels"].get(LABEL_RELAY) == value(plan["command"], "--port")) is relayed


def test_a_stack_that_would_listen_beyond_loopback_is_not_placed() -> None:
    wide = Stack.model_validate(MINIMAL | {"vllm": MINIMAL["vllm"] | {"host": "0.0.0.0"}, "allow": ["all-interfaces"]})
    with pytest.raises(SparkctlError, match="listen beyond loopback"):
        placeable(wide)
    assert placeable(Stack.model_validate(MINIMAL)).vllm.host == "127.0.0.1"
