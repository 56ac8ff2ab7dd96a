"""The fleet tier's fixtures: one set of namespace hosts per pytest session (`fleet`), the sim
image loaded into all of them (`fleet_sim`), and an engine started on one host (`start_on`).

The hosts are never skipped: a machine that cannot create namespaces fails these tests with what
to do (CI runs them as root). Their setup time per host is printed at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.deploy.health import http_status
from tests.fleet.hosts import Host, Hosts
from tests.fleet.images import image_id, keep, load
from tests.fleet.network import HarnessError

SIM_ENV = {"SPARKCTL_SIM_TIME_SCALE": "0.01"}
SUMMARY: list[str] = []


@pytest.fixture(scope="session")
def fleet(images: dict[str, str]) -> Iterator[Hosts]:
    """Three hosts a, b, c for the whole session; removed (and swept) when it ends. Hosts b and c
    start with the vLLM CPU image when the build cache has its seed (`fleet_vllm_cpu`)."""
    seed = _vllm_seed(images["vllm-cpu"])
    hosts = Hosts(3, seeds={"b": seed, "c": seed} if seed and seed.is_dir() else None)
    try:
        hosts.__enter__()
    except HarnessError as e:
        pytest.fail(f"fleet hosts could not be set up: {e}", pytrace=False)
    SUMMARY.append(hosts.summary())
    try:
        with pytest.MonkeyPatch.context() as env:  # for the session's fleet tests, restored after them
            bypass_proxies(env, [fleet_host.address for fleet_host in hosts] + [hosts.network.gateway])
            yield hosts
    finally:
        hosts.__exit__(None, None, None)


@pytest.fixture(scope="session")
def image_cache(tmp_path_factory) -> Path:
    """`docker save` tarballs, shared by every Hosts of the session."""
    return tmp_path_factory.mktemp("fleet-images")


@pytest.fixture(scope="session")
def fleet_sim(fleet: Hosts, images: dict[str, str], image_cache: Path) -> str:
    """The sim image, loaded into every host of `fleet`."""
    seconds = load(fleet.hosts, images["sim"], cache=image_cache)
    SUMMARY.append(f"  sim image ({images['sim']}) by docker save | load: "
                   + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items()))
    return images["sim"]


@pytest.fixture(scope="session")
def fleet_vllm_cpu(fleet: Hosts, images: dict[str, str], image_cache: Path) -> str:
    """The real vLLM CPU image (3.9 GB) on hosts b and c (where multi-node ranks run): there from
    the start when `fleet` seeded them, else loaded (~110 s each) and, with SPARKCTL_BUILD_CACHE
    set, kept as the seed of the next session's hosts."""
    image, seed = images["vllm-cpu"], _vllm_seed(images["vllm-cpu"])
    if all(_holds(fleet[name], image) for name in "bc"):
        SUMMARY.append(f"  vLLM CPU image ({image}) seeded from {seed}: "
                       + ", ".join(f"{h.name} {h.timings['seed']:.2f} s" for h in (fleet["b"], fleet["c"])))
        return image
    seconds = load([fleet["b"], fleet["c"]], image, cache=image_cache)
    for tar in image_cache.glob("*vllm-cpu*.tar"):
        tar.unlink()
    if seed:
        for old in seed.parent.glob("vllm-cpu-root-*"):
            shutil.rmtree(old)
        for tar in seed.parent.glob("*vllm-cpu*.tar"):  # kept by earlier sessions, before the seed
            tar.unlink()
        keep(fleet["b"], image, seed)
    SUMMARY.append(f"  vLLM CPU image ({image}) by docker save | load: "
                   + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items()))
    return image


def _holds(host: Host, image: str) -> bool:
    """Whether `host` was seeded with `image` and its dockerd lists it."""
    if "seed" not in host.timings:
        return False
    try:
        host.docker("image", "inspect", image)
    except HarnessError:
        return False
    return True


def _vllm_seed(image: str) -> Path | None:
    """Where the vLLM CPU image's seed is kept (named by the image's id), with a build cache."""
    kept = os.environ.get("SPARKCTL_BUILD_CACHE")
    return Path(kept) / "fleet-images" / f"vllm-cpu-root-{image_id(image)[:16]}" if kept else None


class HostEngine:
    """The sim engine in a host's dockerd, `--network host`, bound to the host's address."""

    def __init__(self, host: Host, image: str, model_dir: Path, *, port: int = 8000, name: str = "sim") -> None:
        self.host, self.name = host, name
        self.url = f"http://{host.address}:{port}"
        self.id = host.docker("run", "-d", "--name", name, "--network", "host", "--ipc", "host",
                              *(f"-e={k}={v}" for k, v in SIM_ENV.items()), "-v", f"{model_dir}:/model:ro",
                              image, "serve", "/model", "--served-model-name", "tiny", "--host", host.address,
                              "--port", str(port), "--max-model-len", "2048").strip()

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while http_status(self.url + "/health") != 200:
            if self.host.docker("inspect", "-f", "{{.State.Status}}", self.id).strip() == "exited":
                raise AssertionError(f"engine exited on host {self.host.name}:\n{self.host.docker('logs', self.id)}")
            assert time.monotonic() < deadline, f"engine on host {self.host.name} not healthy after {timeout} s"
            time.sleep(0.05)

    def remove(self) -> None:
        if self.host.answers():
            self.host.docker("rm", "-f", self.id)


@pytest.fixture
def start_on(fleet_sim: str, tiny_model_dir: Path) -> Iterator:
    """`start_on(host)` runs the sim on that host; removed when the test ends."""
    started: list[HostEngine] = []

    def start(host: Host, **kw) -> HostEngine:
        started.append(HostEngine(host, fleet_sim, tiny_model_dir, **kw))
        return started[-1]

    yield start
    for engine in started:
        engine.remove()


def bypass_proxies(env: pytest.MonkeyPatch, addresses: list[str]) -> None:
    """Requests to the hosts go straight over the bridge, never to a proxy the environment names."""
    for key in ("no_proxy", "NO_PROXY"):
        env.setenv(key, ",".join(filter(None, [os.environ.get(key, ""), *addresses])))


def pytest_terminal_summary(terminalreporter) -> None:
    for text in SUMMARY:
        terminalreporter.write_line(text)
