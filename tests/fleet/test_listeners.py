"""What a placed engine listens on, as the kernel reports it, judged by its host's agent after
the engine starts: the sim in a namespace host's dockerd (`--network host`, so it shares the
host's network namespace with every other socket there, the host's veth address among them),
labelled as the agent's own, checked by a `HostAgent` in this process on that host's Docker.

Slow (the session's namespace hosts, and a container per test): what it covers that a unit test
cannot is the kernel's word on a real container, whatever its command line says; the unit tests
of `agent.exposed` cover the verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkctl import instance as instances
from sparkctl.container import LABEL_PLACED, LABEL_STACK
from sparkctl.errors import SparkctlError
from sparkctl.fleet.hostagent import HostAgent
from tests.fleet.conftest import SIM_ENV
from tests.fleet.exposure import send
from tests.fleet.hosts import Host, Hosts

INSTANCE = "fleetlisten"
PORT = 8710


@pytest.fixture
def placed_sim(fleet: Hosts, fleet_sim: str, tiny_model_dir: Path) -> Iterator[Callable[..., str]]:
    """`placed_sim(stack, *hosts)` runs the sim on host a as the agent runs a placed engine
    (labelled, host network), with `--host` given once per entry of `hosts`, in that order, as a
    wrapper that appends one would; returns once it answers where the last one says."""
    host, started = fleet["a"], []

    def start(stack: str, *binds: str) -> str:
        container = host.docker(
            "run", "-d", "--network", "host", "--label", f"{LABEL_STACK}={stack}", "--label", f"{LABEL_PLACED}=1",
            "--label", f"{instances.LABEL}={INSTANCE}", *(f"-e={k}={v}" for k, v in SIM_ENV.items()),
            "-v", f"{tiny_model_dir}:/model:ro", fleet_sim, "serve", "/model", "--served-model-name", "tiny",
            *(arg for bind in binds for arg in ("--host", bind)), "--port", str(PORT),
            "--max-model-len", "2048").strip()
        started.append(container)
        _wait_healthy(host, container, "127.0.0.1" if binds[-1] == "0.0.0.0" else binds[-1])
        return container

    yield start
    for container in started:
        host.docker("rm", "-f", container)


def test_an_engine_that_listens_beyond_loopback_is_removed_with_the_address(fleet: Hosts, placed_sim) -> None:
    """Its argv says 127.0.0.1 first; the kernel says 0.0.0.0 (the second `--host` wins)."""
    host = fleet["a"]
    placed_sim("wide", "127.0.0.1", "0.0.0.0")
    agent = HostAgent(host="a", docker_url=host.docker_url, instance=INSTANCE)
    with pytest.raises(SparkctlError, match=rf"stack wide on host a: its engine listens beyond loopback on "
                                            rf"0\.0\.0\.0:{PORT} \(pid \d+\), so it was removed"):
        agent._confine("wide", PORT, every_port=True)
    assert host.docker("ps", "-aq", "--filter", f"label={LABEL_STACK}=wide").strip() == ""


def test_an_engine_on_the_hosts_address_is_removed_too(fleet: Hosts, placed_sim) -> None:
    host = fleet["a"]
    placed_sim("veth", host.address)
    agent = HostAgent(host="a", docker_url=host.docker_url, instance=INSTANCE)
    with pytest.raises(SparkctlError, match=rf"on {host.address}:{PORT} \(pid"):
        agent._confine("veth", PORT, every_port=True)
    assert host.docker("ps", "-aq", "--filter", f"label={LABEL_STACK}=veth").strip() == ""


def test_an_engine_on_loopback_passes_and_keeps_running(fleet: Hosts, placed_sim) -> None:
    host = fleet["a"]
    container = placed_sim("narrow", "127.0.0.1")
    agent = HostAgent(host="a", docker_url=host.docker_url, instance=INSTANCE)
    agent._confine("narrow", PORT, every_port=True)
    assert host.docker("inspect", "-f", "{{.State.Status}}", container).strip() == "running"


def _wait_healthy(host: Host, container: str, address: str, timeout: float = 60) -> None:
    """Until the sim answers on `address` (asked from inside the host)."""
    deadline = time.monotonic() + timeout
    while send(host, "GET", f"http://{address}:{PORT}/health") != "200":
        if host.docker("inspect", "-f", "{{.State.Status}}", container).strip() == "exited":
            raise AssertionError(f"the sim exited on host {host.name}:\n{host.docker('logs', container)}")
        assert time.monotonic() < deadline, f"the sim on host {host.name} not healthy after {timeout} s"
        time.sleep(0.2)
