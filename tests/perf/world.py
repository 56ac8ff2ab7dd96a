"""A throwaway world for benchmarks: loopback registry with the sim image published, the local
Hub with the fixture repos, and sparkctl settings pointing at both (in a temp dir). Also how
every benchmark reports a figure (median, min and max over its runs) and the machine's load,
and the smoke mode `make test` runs them in (SPARKCTL_PERF_SMOKE=1: one run, small sizes).

Each figure is printed twice: in the benchmark's own line for people, and as one JSON line
(`figure`) with its value, unit, the range a sane measurement lands in and the control it is
judged beside. The smoke test checks those (finite, in range, each control printed); the goals
are `make perf`'s to judge, not the smoke test's. A benchmark ends on SIGTERM as on an exception:
its `finally` blocks and atexit sweeps run."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.fakes import sandbox
from tests.fakes.hub import Hub, HubServer
from tests.fakes.registry import Registry
from tests.fakes.repos import seed_repos
from tests.fakes.tinymodel import cached_model

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.teardown import stop  # noqa: E402

SPARKCTL = str(ROOT / ".venv" / "bin" / "sparkctl")
SMOKE = os.environ.get("SPARKCTL_PERF_SMOKE") == "1"
signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def runs(full: int, smoke: int = 1) -> int:
    """How many runs a figure takes: `full` in `make perf`, `smoke` in `make test`."""
    return smoke if SMOKE else full


def spread(values: list[float], *, scale: float = 1.0, unit: str = "s", digits: int = 3) -> str:
    """`median X (min A, max B, n=N)`: a figure with its spread, never an average alone."""
    v = [x * scale for x in values]
    return (f"{statistics.median(v):.{digits}f} {unit} (min {min(v):.{digits}f}, max {max(v):.{digits}f}, "
            f"n={len(v)})")


def figure(name: str, value: float, unit: str, *, sane: tuple[float, float], control: str | None = None) -> None:
    """One figure as a JSON line for the smoke test: `sane` is the range any honest run lands in on
    a loaded 2-core machine (not the goal); `control` names the figure printed beside it that
    measures the method's own noise (a difference that may come out below zero needs one)."""
    print(json.dumps({"figure": name, "value": _rounded(value), "unit": unit, "sane": [_rounded(b) for b in sane],
                      "control": control}), flush=True)


def _rounded(value: float) -> float:
    return round(value, 6) if isinstance(value, float) else value


def load() -> str:
    """The machine's load average (1, 5, 15 min), printed before a benchmark's figures."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cores"


@contextlib.contextmanager
def world(*, time_scale: str = "0.01") -> Iterator[tuple[dict[str, str], Hub]]:
    with tempfile.TemporaryDirectory(prefix="sparkctl-perf-") as tmp:
        root = Path(tmp)
        for name in ("stacks", "patches"):  # a copy: pins and bans the benchmarks record stay in it
            shutil.copytree(ROOT / name, root / name)
        instance = sandbox.environment("perf")  # its own instance on free ports, beside live stacks
        registry = Registry(root / "registry")
        registry.publish_sim()
        cache = Path(os.environ.get("SPARKCTL_BUILD_CACHE", root)) / "models"
        with HubServer(Hub(seed_repos(cached_model(cache)))) as hub:
            env = {**os.environ, "SPARKCTL_REGISTRY_MIRRORS": f"ghcr.io={registry.host},docker.io={registry.host}",
                   "SPARKCTL_HF_ENDPOINT": hub.endpoint, "SPARKCTL_HF_CACHE_DIR": str(root / "hf" / "hub"),
                   "SPARKCTL_STATE_DIR": str(root / "state"), "SPARKCTL_GPUS": "none",
                   "SPARKCTL_ENGINE_ENV": f"SPARKCTL_SIM_TIME_SCALE={time_scale}",
                   "SPARKCTL_STACKS_DIR": str(root / "stacks"), "SPARKCTL_PATCHES_DIR": str(root / "patches"),
                   # Offline (no internet probe) and the sim, whose replies cannot pass a coherence check.
                   "SPARKCTL_BENCH_CORPUS": "loopback", "SPARKCTL_BENCH_SKIP_COHERENCE": "1",
                   "PERF_ROOT": str(root), "PERF_HUB": hub.endpoint, **instance}
            try:
                yield env, hub.hub
            finally:
                from sparkctl.cli.client import DaemonClient

                DaemonClient(root / "state" / "sparkctl.sock").stop()  # one a command started, before its stacks go
                sandbox.remove(instance["SPARKCTL_INSTANCE"])
                stop(registry.proc, 10)


@contextlib.contextmanager
def daemon(env: dict[str, str]) -> Iterator[subprocess.Popen]:
    """`sparkctl daemon` on the world's state dir, until the block ends; CLI calls go through it."""
    from sparkctl.cli.client import DaemonClient

    proc = subprocess.Popen([SPARKCTL, "daemon"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = DaemonClient(Path(env["SPARKCTL_STATE_DIR"]) / "sparkctl.sock")
    try:
        deadline = time.monotonic() + 60
        while not client.available() or client.holder() != proc.pid:  # its own, not one a command started
            assert proc.poll() is None and time.monotonic() < deadline, "the daemon did not start"
            time.sleep(0.05)
        yield proc
    finally:
        stop(proc, 30)


def sparkctl(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`sparkctl ARGS`; one that fails raises with what it printed, which says why."""
    done = subprocess.run([SPARKCTL, *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"sparkctl {' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}"
                           f"{done.stderr[-4000:]}")
    return done


def idle_cpu(pid: int, *, windows: int, seconds: float) -> tuple[list[float], float]:
    """A process's CPU % over each of `windows` idle windows of `seconds`, and its RSS (MB) after
    the last (the daemon's idle figure)."""
    ticks = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks

    percents = []
    for _ in range(windows):
        start_cpu, start = cpu(), time.monotonic()
        time.sleep(seconds)
        percents.append(100 * (cpu() - start_cpu) / (time.monotonic() - start))
    rss_kb = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith("VmRSS"))
    return percents, rss_kb / 1024


def wait(check, timeout: float = 60) -> None:
    """Until `check()` holds; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(0.02)
