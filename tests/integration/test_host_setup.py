"""scripts/host-setup.sh never upgrades the base system: its own install line, simulated with
`apt-get -s` in the bookworm base image (with the trixie source it adds), takes exactly Docker's
five packages from trixie and everything else from bookworm. Needs apt's package lists, so it
runs in a container (about 10 s); nothing cheaper can show what apt would resolve."""

from __future__ import annotations

import re
from pathlib import Path

from docker.types import Mount

from tests.conftest import TEST_LABEL

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "host-setup.sh"
DOCKER_FROM_TRIXIE = {"docker.io", "docker-cli", "docker-buildx", "docker-compose", "containerd"}


def test_host_setup_takes_only_docker_from_trixie(engine, base_image, run_id) -> None:
    container = engine.client.containers.run(
        base_image, ["bash", "/host-setup.sh", "--simulate"], detach=True, network_mode="host",
        mounts=[Mount("/host-setup.sh", str(SCRIPT), type="bind", read_only=True)], labels={TEST_LABEL: run_id})
    assert container.wait(timeout=300)["StatusCode"] == 0, container.logs().decode()[-2000:]
    plan = re.findall(r"^Inst (\S+) \(\S+ (\S+) \[", container.logs().decode(), re.M)
    from_trixie = {package for package, release in plan if release.startswith("Debian:13")}
    assert len(plan) > 20 and from_trixie == DOCKER_FROM_TRIXIE, sorted(from_trixie)
