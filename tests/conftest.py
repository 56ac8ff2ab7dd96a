"""Shared fixtures: a scratch copy of the shipped stacks, the CLI runner, and the real
components (Docker engine, a registry on loopback, engine containers).

Under CI (`CI` set) a missing engine or image is a failure; elsewhere its tests skip with one
line. Everything a test creates carries `sparkctl.test-run=<id>` and is removed afterwards. The
session ends with two checks that fail it: nothing of the run is left (tests/leftovers.py: swept,
then reported) and no neighbour container changed (tests/neighbours.py)."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from sparkctl.deploy.health import http_status
from sparkctl.gateway.proxy import Gateway
from tests import leftovers, neighbours, teardown
from tests.fakes import sandbox
from tests.fakes.registry import SIM_IMAGE  # sparkctl-sim:latest, or SPARKCTL_TEST_SIM_IMAGE's
from tests.neighbours import TEST_LABEL

ROOT = Path(__file__).resolve().parents[1]

# Pinned for this process and everything it starts (daemons, CLI subprocesses, llama-benchy): no
# test decides "online" by probing the internet (the corpus's `auto` would try a TCP connect to
# Project Gutenberg), and the engines here (the sim, random weights) cannot answer llama-benchy's
# coherence question. The one test of `auto` sets its own value (through monkeypatch). The owner's
# config dir is one that cannot exist (under /dev/null): no test, daemon or CLI the run starts reads
# the owner's ~/.config/sparkctl; a test of the owner's layer sets its own (`workspace`: one in its
# tmp dir). These three, and the run's id (`SPARKCTL_TEST_RUN`, tests/teardown.py: every process
# the run starts carries it, so the session's end can find what the run left), are the suite's only
# deliberate process-wide changes to the environment: every other test changes `os.environ` through
# monkeypatch, so nothing leaks into the tests after it.
os.environ["SPARKCTL_BENCH_CORPUS"] = "loopback"
os.environ["SPARKCTL_BENCH_SKIP_COHERENCE"] = "1"
os.environ["SPARKCTL_CONFIG_DIR"] = "/dev/null/sparkctl"

# Hypothesis: a failure always prints the blob that reproduces it (`@reproduce_failure`), and under
# CI the examples are derived from each test itself, so every CI run tries the same inputs and a
# red run is not a roll of the dice. A developer's run keeps exploring new inputs.
hypothesis_settings.register_profile("dev", print_blob=True)
hypothesis_settings.register_profile("ci", print_blob=True, derandomize=True)
hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "dev")

NEIGHBOURS = pytest.StashKey["neighbours.Watch | None"]()
PROBLEMS = pytest.StashKey[list[str]]()
CPU_AT_SETUP = pytest.StashKey[float]()
SPENT: dict[str, float] = {}  # test id: machine CPU-s (pytest_runtest_makereport)


def pytest_configure(config: pytest.Config) -> None:
    teardown.run_id()  # in the environment from here on: every process the run starts carries it


def pytest_sessionstart(session: pytest.Session) -> None:
    """Record the engine's neighbours, once per run (not in xdist workers)."""
    if not hasattr(session.config, "workerinput"):
        session.config.stash[NEIGHBOURS] = neighbours.Watch.start()


@pytest.hookimpl(trylast=True)  # after the runner's own, which tears the session's fixtures down
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the session if it left anything of its own (swept now) or changed a neighbour."""
    if hasattr(session.config, "workerinput"):
        return
    watch = session.config.stash.get(NEIGHBOURS, None)
    problems = leftovers.check(teardown.run_id()) + [f"neighbour changed: {line}" for line in
                                                     (watch.changes() if watch else [])]
    session.config.stash[PROBLEMS] = problems
    if problems and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[CPU_AT_SETUP] = machine_cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Count the machine's busy CPU seconds during each test, setup to teardown: on 2 cores the
    suite's time is its CPU work, so this says where to cut. Everything running counts, a tier
    beside this one too. Carried in the teardown report, so xdist's workers report it as well."""
    outcome = yield
    if call.when == "teardown" and CPU_AT_SETUP in item.stash:
        outcome.get_result().user_properties.append(("machine_cpu_s", machine_cpu_seconds() - item.stash[CPU_AT_SETUP]))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == "machine_cpu_s":
            SPENT[report.nodeid] = value


def machine_cpu_seconds() -> float:
    """CPU seconds all cores spent busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        ticks = [int(part) for part in stat.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    if SPENT:
        terminalreporter.write_sep("=", f"busiest 10 tests, in machine CPU-s (all tests: {sum(SPENT.values()):.0f})")
        for nodeid, seconds in sorted(SPENT.items(), key=lambda kv: -kv[1])[:10]:
            terminalreporter.write_line(f"{seconds:7.1f}  {nodeid}")
    for line in config.stash.get(PROBLEMS, []):
        terminalreporter.write_line(f"FAILED session check: {line}", red=True, bold=True)


def wait_for(check, timeout: float = 30, what: str = "", logs=lambda: "") -> None:
    """Poll `check` until it is true; fail after `timeout` s naming `what` (and the tail of `logs()`)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}\n{logs()[-4000:]}"
        time.sleep(0.02)


def stop_daemon(state_dir: Path) -> None:
    """Stop the daemon a command of the test started on `state_dir` (the CLI starts one when none
    runs), before the test's containers are removed: it would start them again."""
    from sparkctl.cli.client import DaemonClient

    DaemonClient(state_dir / "sparkctl.sock").stop()


def image_policy(root: Path):
    """The image policy in force for the workspace at `root`: its stacks' images.yaml, its config
    dir's, and what its state recorded over them."""
    from sparkctl.spec.imagefile import PolicyFiles
    from sparkctl.state.store import Store

    files = PolicyFiles(root / "stacks" / "images.yaml", root / "config" / "images.yaml")
    return Store(root / "state" / "sparkctl.db", policy_files=files).images.policy()


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of stacks/ and patches/, with settings pointed at it, a private state dir, and an
    instance of its own on free ports: safe beside an owner's live stacks. The daemon its
    commands start is stopped at the end."""
    for name in ("stacks", "patches", "compose"):
        shutil.copytree(ROOT / name, tmp_path / name)
    for key, value in sandbox.environment("test").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARKCTL_STACKS_DIR", str(tmp_path / "stacks"))
    monkeypatch.setenv("SPARKCTL_PATCHES_DIR", str(tmp_path / "patches"))
    monkeypatch.setenv("SPARKCTL_COMPOSE_DIR", str(tmp_path / "compose"))
    monkeypatch.setenv("SPARKCTL_CONFIG_DIR", str(tmp_path / "config"))  # the owner's, empty until a test writes it
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKCTL_HF_CACHE_DIR", str(tmp_path / "hf"))
    # The sentinel reads a kernel log and a meminfo of the test's own (a still copy of the host's):
    # the machine's, which other tests drain, must not make it stop this test's engines.
    (tmp_path / "kmsg").touch()
    (tmp_path / "meminfo").write_text(Path("/proc/meminfo").read_text())
    monkeypatch.setenv("SPARKCTL_KERNEL_LOG", str(tmp_path / "kmsg"))
    monkeypatch.setenv("SPARKCTL_MEMINFO_PATH", str(tmp_path / "meminfo"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("SPARKCTL_HF_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    stop_daemon(tmp_path / "state")


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `sparkctl ARGS...` in-process; returns (exit code, stdout, stderr)."""
    from sparkctl.cli import app as cli_app
    from sparkctl.cli.app import main

    def run(*args: str) -> tuple[int, str, str]:
        cli_app._runtime.__dict__.clear()
        cli_app._runtime.debug = False
        code = main(args)
        out, err = capsys.readouterr()
        return code, out, err

    return run


BASE_IMAGE = "sparkctl-test/base:bookworm"


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI must provide it: run `make test`)")
    pytest.skip(f"{what}; `make test` sets it up")


@pytest.fixture(scope="session")
def engine():
    from sparkctl.adapters.docker import DockerEngine
    from sparkctl.errors import DockerError

    try:
        engine = DockerEngine()
        engine.client.ping()
    except (DockerError, Exception) as e:  # noqa: BLE001 - any failure means no usable engine
        _missing(f"no Docker engine: {e}")
    return engine


@pytest.fixture(scope="session")
def base_image(engine) -> str:
    """The locally built Debian base image (scripts/base-image.sh)."""
    if not engine.client.images.list(name=BASE_IMAGE):
        _missing(f"image {BASE_IMAGE} is missing (scripts/base-image.sh builds it)")
    return BASE_IMAGE


@pytest.fixture
def run_id(engine) -> Iterator[str]:
    """A per-test id; containers labelled with it are removed when the test ends."""
    rid = uuid.uuid4().hex[:10]
    yield rid
    for c in engine.client.api.containers(all=True, filters={"label": f"{TEST_LABEL}={rid}"}):
        engine.remove(c["Id"])


free_port = sandbox.free_port


def _serve_registry(tmp_path_factory, name: str) -> Iterator:
    if shutil.which("docker-registry") is None:
        _missing("docker-registry is not installed")
    from tests.fakes.registry import Registry

    reg = Registry(tmp_path_factory.mktemp(name))
    yield reg
    teardown.stop(reg.proc, 10)


@pytest.fixture(scope="session")
def registry(engine, tmp_path_factory) -> Iterator:
    yield from _serve_registry(tmp_path_factory, "registry")


@pytest.fixture(scope="module")
def own_registry(engine, tmp_path_factory) -> Iterator:
    """A registry of the module's own, for tests that point real names at other images (the shared
    one serves those names as the sim, for every later test)."""
    yield from _serve_registry(tmp_path_factory, "own-registry")


@pytest.fixture
def tiny_image(engine) -> Iterator:
    """Make one-file images locally (nothing can be pulled): distinct content, distinct digest."""
    made: list[str] = []

    def make(content: str) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("stamp")
            info.size = len(content.encode())
            tar.addfile(info, io.BytesIO(content.encode()))
        repo, tag = "sparkctl-test/tiny", uuid.uuid4().hex[:8]
        engine.client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag)
        made.append(f"{repo}:{tag}")
        return made[-1]

    yield make
    for name in made:
        engine.client.images.remove(name, force=True)


VLLM_CPU_IMAGE = "sparkctl-test/vllm-cpu:0.32.0"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random-weight Llama with a chat template, readable inside containers; cached by
    the content of its generator in SPARKCTL_BUILD_CACHE (else a temp dir)."""
    from tests.fakes.tinymodel import cached_model

    cache = os.environ.get("SPARKCTL_BUILD_CACHE")
    return cached_model(Path(cache) / "models" if cache else tmp_path_factory.mktemp("models"))


class EngineContainer:
    """An engine image serving a model dir on 127.0.0.1:<free port> (host network, ipc host)."""

    def __init__(self, engine, image: str, model_dir: Path, *args: str, run_id: str,
                 env: dict[str, str] | None = None, mounts: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        from docker.types import Mount

        binds = [Mount("/model", str(model_dir), type="bind", read_only=True)]
        binds += [Mount(target, host, type="bind", read_only=True) for host, target in (mounts or {}).items()]
        self.container = engine.client.containers.run(
            image, ["serve", "/model", "--served-model-name", "tiny", "--host", "127.0.0.1",
                    "--port", str(self.port), *args],
            detach=True, network_mode="host", ipc_mode="host", environment=env or {},
            mounts=binds, labels={TEST_LABEL: run_id})

    def status(self, path: str = "/health") -> int | None:
        return http_status(self.url + path)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while self.status() != 200:
            self.container.reload()
            if self.container.status == "exited":
                raise AssertionError(f"engine exited:\n{self.logs()}")
            assert time.monotonic() < deadline, f"engine not healthy after {timeout} s:\n{self.logs()}"
            time.sleep(0.1)

    def logs(self, tail: int = 30) -> str:
        return self.container.logs(tail=tail).decode(errors="replace")

    def wait_exit(self, timeout: float = 60) -> int:
        return self.container.wait(timeout=timeout)["StatusCode"]


@pytest.fixture(scope="session")
def images(engine) -> dict[str, str]:
    found = {}
    for key, image in (("sim", SIM_IMAGE), ("vllm-cpu", VLLM_CPU_IMAGE)):
        if not engine.client.images.list(name=image):
            _missing(f"image {image} is missing (`make images` builds it)")
        found[key] = image
    return found


@pytest.fixture
def start_engine(engine, images, tiny_model_dir, run_id):
    """Start an engine container by kind ("sim" or "vllm-cpu"); removed when the test ends."""

    def start(kind: str, *args: str, **kw) -> EngineContainer:
        return EngineContainer(engine, images[kind], tiny_model_dir, *args, run_id=run_id, **kw)

    return start


HUB_TOKEN = "hf_test_token_123"


@pytest.fixture(scope="session")
def published(registry, images):
    """The loopback registry with the sim image under every real name the stacks use."""
    registry.publish_sim(images["sim"])
    return registry


@pytest.fixture(scope="session")
def hub(tiny_model_dir):
    """The local Hub serving the fixture repos (DiffusionGemma gated behind HUB_TOKEN)."""
    from tests.fakes.hub import Hub, HubServer
    from tests.fakes.repos import seed_repos

    with HubServer(Hub(seed_repos(tiny_model_dir), token=HUB_TOKEN)) as server:
        yield server


FAST = "SPARKCTL_SIM_TIME_SCALE=0.01"


@pytest.fixture
def world(workspace, published, hub, monkeypatch, engine):
    """Settings pointed at the loopback registry and Hub; sparkctl containers removed after."""
    monkeypatch.setenv("SPARKCTL_REGISTRY_MIRRORS", f"ghcr.io={published.host},docker.io={published.host}")
    monkeypatch.setenv("SPARKCTL_HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("SPARKCTL_GPUS", "none")
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", FAST)
    yield workspace
    stop_daemon(workspace / "state")
    sandbox.remove(instance())


def instance() -> str:
    """The current test's sparkctl instance (set by `workspace`)."""
    return os.environ["SPARKCTL_INSTANCE"]


def port(shipped: int) -> int:
    """Where a stack's shipped port is in the current test's instance."""
    return shipped + int(os.environ["SPARKCTL_PORT_OFFSET"])


def name(stack: str) -> str:
    """The container name of a stack in the current test's instance."""
    from sparkctl.instance import container_name

    return container_name(stack, instance())


def ours(engine, stack: str | None = None) -> list[dict]:
    """The current test instance's sparkctl containers (of one stack, if given)."""
    labels = [f"sparkctl.instance={instance()}", f"sparkctl.stack={stack}" if stack else "sparkctl.stack"]
    return engine.client.api.containers(all=True, filters={"label": labels})


class Running:
    """A gateway served from its own event loop thread on 127.0.0.1:<free port>."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway, self.port = gateway, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(self.gateway.serve("127.0.0.1", self.port))
        ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        def close() -> None:
            self.server.close()
            self.gateway.close()
            self.loop.stop()

        self.loop.call_soon_threadsafe(close)
        self.thread.join(10)


class ServedApi:
    """The daemon's real API app (`daemon.api.build`) over `service` (a fake of both its commands
    and its queries), on a unix socket, served from its own event loop thread while the `with`
    block runs; the block gets the socket's path."""

    def __init__(self, service, sock: Path) -> None:
        self.service, self.sock = service, sock
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Path:
        from aiohttp import web

        from sparkctl.daemon import api

        async def start() -> web.AppRunner:
            runner = web.AppRunner(api.build(self.service, self.service))
            await runner.setup()
            await web.UnixSite(runner, str(self.sock)).start()
            return runner

        self.thread.start()
        self.runner = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        return self.sock

    def __exit__(self, *_exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
