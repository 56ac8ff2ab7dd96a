"""`make test` runs every benchmark once in its smoke mode (one run, small sizes): each must run
to the end and print its figures, so `make perf` cannot rot between full runs. The figures are
not judged here; `make perf` measures them. Each benchmark builds a world of its own (instance,
ports, registry, fleet hosts), so two run at once: most of a smoke run is waiting for engines and
daemons to start, and this halves the tier's time."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BENCHMARKS = sorted(HERE.glob("bench_*.py"))
AT_ONCE = 2


def smoke(bench: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(bench)], env={**os.environ, "SPARKCTL_PERF_SMOKE": "1"},
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def runs() -> dict[Path, Future]:
    with ThreadPoolExecutor(AT_ONCE) as pool:
        yield {bench: pool.submit(smoke, bench) for bench in BENCHMARKS}


@pytest.mark.timeout(1020)  # above the smoke run's own bound (900 s, then its stop); each waits for its own run
@pytest.mark.parametrize("bench", BENCHMARKS, ids=lambda p: p.stem)
def test_the_benchmark_runs_and_prints_its_figures(bench: Path, runs: dict[Path, Future]) -> None:
    done = runs[bench].result()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("load average"), done.stdout
    assert len(lines) >= 2 and any(ch.isdigit() for ch in "".join(lines[1:])), done.stdout
    print(done.stdout)
