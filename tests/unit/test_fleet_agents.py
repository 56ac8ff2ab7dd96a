"""The host agents' pure parts: which hosts are asked and which agents ensured (against a
recording backend), merging the agents' answers into `fleet ps` rows and a `fleet down` outcome,
the image-drift verdict, and picking the RepoDigest that stands for a ref."""

from __future__ import annotations

import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.adapters import processes
from sparkctl.adapters.raynode import _check_ports
from sparkctl.errors import SparkctlError
from sparkctl.fleet import agents, local, survey
from sparkctl.fleet.hostagent import _digest_for, exposed
from sparkctl.node import (
    CALLS,
    AgentAnswer,
    AgentSpec,
    Containers,
    HostContainer,
    HostImage,
    Node,
    NodeLaunch,
    NodeRecord,
    NodeState,
    Prepared,
    Removed,
    Started,
    decode,
    encode,
)
from sparkctl.settings import Settings
from sparkctl.spec.fleet import load_fleet

D1, D2, D3 = (f"sha256:{c * 64}" for c in "123")
FLEET = """head: a
hosts:
""" + "".join(f"""  - name: {n}
    serving: {{interface: lo, address: 127.0.0.{i + 2}}}
    memory: 2GiB
    ray: {{address: 127.0.0.{i + 2}, port: {27000 + 300 * i}}}
    docker: unix:///run/{n}.sock
""" for i, n in enumerate("abc"))


class RecordingBackend:
    """The `FleetBackend` calls `agents.ask` makes, with canned answers."""

    def __init__(self, nodes: list[Node]) -> None:
        self.node_table, self.asked = nodes, []

    def nodes(self, head: str) -> list[Node]:
        return self.node_table

    def ask_agents(self, head, *, local_address, hosts, call, wait, ensure=None):  # noqa: ANN001
        self.asked.append(dict(head=head, local_address=local_address, hosts=hosts, call=call, ensure=ensure))
        return [AgentAnswer(host=h, value=[]) for h in hosts]


def node(host: str, state: NodeState = NodeState.ALIVE) -> Node:
    return Node(node_id=host * 8, address="127.0.0.1", state=state, resources={f"spark:{host}": 1.0})


def settings_with_node(tmp_path: Path) -> Settings:
    settings = Settings(state_dir=tmp_path, instance="t1")
    local.write_record(settings.fleet_dir / local.RECORD_FILE, NodeRecord(
        host="a", address="127.0.0.2", head="127.0.0.2:27000", is_head=True, temp_dir="/tmp/x", handle={}))
    return settings


def test_every_host_is_answered_for_and_only_live_ones_are_asked(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text(FLEET)
    fleet = load_fleet(tmp_path / "fleet.yaml")
    backend = RecordingBackend([node("a"), node("c", NodeState.DEAD), node("x")])
    answers = agents.ask(backend, head="127.0.0.2:27000", settings=settings_with_node(tmp_path), fleet=fleet,
                         call=Containers(), wait=5)
    assert [a.host for a in answers] == ["a", "b", "c", "x"]  # inventory order, then hosts only Ray knows
    assert [a.ok for a in answers] == [True, False, False, True]
    assert "knows no node" in answers[1].error and "dead" in answers[2].error
    (call,) = backend.asked
    assert call["hosts"] == ["a", "x"] and call["local_address"] == "127.0.0.2"
    assert call["ensure"] == [AgentSpec("a", "unix:///run/a.sock", "t1", "127.0.0.2"), AgentSpec("x", None, "t1")]


def test_asking_needs_a_node_here(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="fleet init"):
        agents.ask(RecordingBackend([node("a")]), head="h:1", settings=Settings(state_dir=tmp_path), fleet=None,
                   call=Containers(), wait=1)


def test_the_census_keeps_silent_hosts_apart() -> None:
    row = HostContainer(host="b", stack="tiny", name="sparkctl-tiny", state="running", image="sim:1", repo_digest=D1)
    found = survey.census([AgentAnswer("a", value=[]), AgentAnswer("b", value=[row, replace(row, stack="big")]),
                           AgentAnswer("c", error="did not answer within 8 s")])
    assert [(r.host, r.stack) for r in found.containers] == [("b", "big"), ("b", "tiny")]
    assert found.hosts == ("a", "b", "c") and found.unreachable == {"c": "did not answer within 8 s"}
    assert found.unreachable and found.containers[1].repo_digest == D1


def test_a_removal_is_complete_only_when_every_host_confirmed() -> None:
    done = survey.removal("tiny", [AgentAnswer("a", value=Removed("a", "tiny", ())),
                                   AgentAnswer("b", value=Removed("b", "tiny", ("sparkctl-tiny",)))])
    assert not done.unreachable and done.removed == {"a": (), "b": ("sparkctl-tiny",)}
    partial = survey.removal("tiny", [AgentAnswer("a", value=Removed("a", "tiny", ())), AgentAnswer("c", error="dead")])
    assert partial.unreachable == {"c": "dead"}


def image(host: str, digest: str | None, image_id: str = "id1", present: bool = True) -> HostImage:
    return HostImage(host=host, present=present, image_id=image_id if present else None, repo_digest=digest)


@pytest.mark.parametrize(("hosts", "wanted", "unreachable", "expected", "differ"), [
    ([image("a", D1), image("b", D1)], None, {}, D1, {}),
    ([image("a", D1), image("b", D1), image("c", D2, "id2")], None, {}, D1, {"c": "a, b have"}),
    ([image("a", D1), image("b", D2, "id2")], None, {}, D1, {"b": "a has"}),  # a tie: the first host's
    ([image("a", D1), image("b", D1)], D2, {}, D2, {"a": "is expected", "b": "is expected"}),
    ([image("a", D1), image("b", None)], None, {}, D1, {}),  # loaded, same image id as a's D1
    ([image("a", D1), image("b", None, "id9")], None, {}, D1, {"b": "no RepoDigest"}),
    ([image("a", D1), image("b", None, present=False)], None, {}, D1, {"b": "has no image"}),
    ([image("a", D1)], None, {"c": "timed out"}, D1, {"c": "could not be asked: timed out"}),
    ([image("a", D3, "id3"), image("b", D1), image("c", D1)], None, {}, D1, {"a": "b, c have"}),
])
def test_the_drift_verdict(hosts, wanted, unreachable, expected, differ) -> None:  # noqa: ANN001
    verdict = survey.verdict("reg/x:1", hosts, wanted=wanted, unreachable=unreachable)
    assert verdict.expected == expected and verdict.same == (not differ)
    assert set(verdict.differences) == set(differ)
    for host, words in differ.items():
        assert words in verdict.differences[host]


def test_answered_images_are_kept_apart_from_silent_hosts() -> None:
    found, unreachable = survey.images([
        AgentAnswer("a", value=image("a", D1)),
        AgentAnswer("b", error="ActorDiedError: its node died")])
    assert found == [image("a", D1)] and unreachable == {"b": "ActorDiedError: its node died"}


@pytest.mark.parametrize(("ref", "repo_digests", "digest"), [
    ("reg:5000/x:v1", [f"reg:5000/x@{D1}"], D1),
    ("reg:5000/x", [f"reg:5000/y@{D2}", f"reg:5000/x@{D1}"], D1),
    (f"reg:5000/x@{D2}", [f"reg:5000/x@{D1}", f"reg:5000/x@{D2}"], D2),
    ("x:v1", [f"mirror/x@{D3}"], D3),  # the only one
    ("x:v1", [], None),  # `docker load` dropped it
    ("x:v1", [f"a/y@{D1}", f"b/z@{D2}"], None),
])
def test_the_repo_digest_that_stands_for_a_ref(ref: str, repo_digests: list[str], digest: str | None) -> None:
    assert _digest_for(ref, repo_digests) == digest


def free_block(tmp_path: Path) -> int:
    """The first port of 256 that nothing listens on, below the kernel's ephemeral range (where a
    busy machine's other connections come and go) and apart from the fleet tests' 27100-27955."""
    for base in range(29000, 32000, 300):
        try:
            _check_ports(NodeLaunch(host="a", address="127.0.0.1", port=base, head="127.0.0.1:1", memory_bytes=1,
                                    temp_dir=tmp_path, log_file=tmp_path / "log", object_store_bytes=1))
            return base
        except SparkctlError:
            continue
    raise AssertionError("no free block of 256 ports between 29000 and 32000")


def test_a_port_left_in_time_wait_is_free_to_start_on(tmp_path: Path) -> None:
    """A node killed mid-connection leaves its ports in TIME_WAIT: a restart must not be refused."""
    server = socket.create_server(("127.0.0.1", free_block(tmp_path) + 1))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server's side closes first: its port is in TIME_WAIT
    client.close()
    server.close()
    states = [line.split()[3] for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
              if line.split()[1].endswith(f":{port:04X}")]
    assert "06" in states  # TIME_WAIT
    launch = NodeLaunch(host="a", address="127.0.0.1", port=port - 1, head="127.0.0.1:1", memory_bytes=1,
                        temp_dir=tmp_path, log_file=tmp_path / "log", object_store_bytes=1)
    _check_ports(launch)  # port - 1 + 1: the node manager's port


def test_every_call_crosses_as_plain_data_and_comes_back_typed() -> None:
    """What `HostAgent.call` sends back (`encode`) is JSON, and the head decodes it into the
    call's answer type, lists and tuples included; every call type names a method of the agent
    that takes that call and returns that answer."""
    import inspect
    import json
    import typing

    from sparkctl.fleet.hostagent import HostAgent

    answers = {
        "describe": AgentSpec("a", None, "t1"),
        "prepare": Prepared("a", {"image": D1}, ("pulled",)),
        "up": Started("a", "http://127.0.0.1:8000", "f1", True, {"engine_start_s": 1.5}, ("note",)),
        "containers": [HostContainer("a", "tiny", "sparkctl-tiny", "running", "sim:1", True, D1)],
        "image_digest": image("a", D1), "pull": image("a", None, present=False),
        "remove": Removed("a", "tiny", ("sparkctl-tiny",)),
    }
    assert set(answers) == set(CALLS)
    for method, kind in CALLS.items():
        call = kind(**{f: "x" if f != "expected" else {} for f in inspect.signature(kind).parameters})
        assert decode(call, json.loads(json.dumps(encode(answers[method])))) == answers[method]
        hints = typing.get_type_hints(getattr(HostAgent, method))
        assert hints["call"] is kind
        assert hints["return"] in (kind.answer, list[kind.answer])


@pytest.mark.parametrize(("listening", "port", "wide"), [
    ([("127.0.0.1", 8000), ("::1", 8000), ("127.0.0.53", 53), ("::ffff:127.0.0.1", 9000)], None, []),
    ([("127.0.0.1", 8000), ("0.0.0.0", 8000)], None, ["0.0.0.0:8000"]),
    ([("127.0.0.1", 8000), ("::", 5555)], None, ["[::]:5555"]),
    ([("10.0.0.2", 29500), ("127.0.0.1", 8000)], 8000, []),  # a rank's own traffic, on its serving address
    ([("10.0.0.2", 29500), ("10.0.0.2", 8000)], 8000, ["10.0.0.2:8000"]),
    ([("::ffff:10.0.0.2", 8000)], None, ["[::ffff:10.0.0.2]:8000"]),
])
def test_what_a_placed_engine_may_not_listen_on(listening, port, wide) -> None:  # noqa: ANN001
    listeners = [processes.Listener(address, p, pid=7) for address, p in listening]
    assert [str(listener) for listener in exposed(listeners, port=port)] == wide


@pytest.mark.parametrize(("hexed", "address"), [
    ("0100007F", "127.0.0.1"), ("00000000", "0.0.0.0"), ("0201000A", "10.0.1.2"),
    ("00000000000000000000000001000000", "::1"), ("0000000000000000FFFF00000100007F", "::ffff:127.0.0.1"),
])
def test_proc_tcp_addresses_are_read_in_the_machines_byte_order(hexed: str, address: str) -> None:
    assert processes._address(hexed) == address


def test_this_process_listening_socket_is_found_by_its_inode() -> None:
    with (socket.create_server(("127.0.0.1", 0)) as server,
          socket.create_server(("::1", 0), family=socket.AF_INET6) as six):
        found = [(f.address, f.port, f.pid) for f in processes.listening([os.getpid()])]
        assert ("127.0.0.1", server.getsockname()[1], os.getpid()) in found
        assert ("::1", six.getsockname()[1], os.getpid()) in found
