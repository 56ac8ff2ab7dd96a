"""`make test` runs every benchmark once in its smoke mode (one run, small sizes): each must run
to the end and print its figures, so `make perf` cannot rot between full runs. Each benchmark
builds a world of its own (instance, ports, registry, fleet hosts), so two run at once: most of a
smoke run is waiting for engines and daemons to start, and this halves the tier's time.

The goals are `make perf`'s to judge, not this test's; what it judges is that each figure is a
measurement at all. Every figure is also printed as a JSON line (tests/perf/world.py `figure`),
and each must be finite and inside the range its benchmark declares sane for a loaded 2-core
machine; a figure that names its control (the method's noise, measured the same way) needs that
control printed too. A difference that may honestly come out below zero (an added latency, a
wait beyond an engine's start) declares how far below, and why, where it is printed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.teardown import stop

HERE = Path(__file__).resolve().parent
BENCHMARKS = sorted(HERE.glob("bench_*.py"))
AT_ONCE = 2
SMOKE_S = 900


def smoke(bench: Path) -> subprocess.CompletedProcess:
    """One smoke run; past SMOKE_S the benchmark gets SIGTERM (its finally blocks and sweeps run),
    then SIGKILL a minute later. Output goes to files: a benchmark being stopped never blocks on a
    full pipe."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, str(bench)], env={**os.environ, "SPARKCTL_PERF_SMOKE": "1"},
                                stdout=out, stderr=err, text=True)
        try:
            proc.wait(SMOKE_S)
        except subprocess.TimeoutExpired:
            stop(proc, 60)
            err.write(f"\n(the smoke run was stopped after {SMOKE_S} s)")
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read())


def judged(stdout: str) -> list[str]:
    """What is wrong with the figures a run printed: none at all, a name printed twice, a value that
    is not a finite number or lies outside its sane range, a range that judges nothing, a control
    named but not printed."""
    figures = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"figure"')]
    names = [f["figure"] for f in figures]
    problems = [] if figures else ["no figure printed as a JSON line"]
    problems += [f"{name!r} printed twice" for name in sorted({n for n in names if names.count(n) > 1})]
    for f in figures:
        value, sane, control = f.get("value"), f.get("sane"), f.get("control")
        if not _finite(value):
            problems.append(f"{f['figure']!r}: {value!r} is not a finite number")
        elif not (isinstance(sane, list) and len(sane) == 2 and all(map(_finite, sane)) and sane[0] < sane[1]):
            problems.append(f"{f['figure']!r}: sane range {sane!r} is not two finite bounds, low < high")
        elif not sane[0] <= value <= sane[1]:
            problems.append(f"{f['figure']!r}: {value:g} {f.get('unit', '')} outside its sane range "
                            f"{sane[0]:g}..{sane[1]:g}")
        if control is not None and control not in names:
            problems.append(f"{f['figure']!r}: its control {control!r} is not printed")
    return problems


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> dict[Path, Future]:
    """The selected benchmarks' smoke runs (all of them, or those `-k` chose), AT_ONCE at a time."""
    chosen = [item.callspec.params["bench"] for item in request.session.items
              if "bench" in getattr(getattr(item, "callspec", None), "params", {})]
    with ThreadPoolExecutor(AT_ONCE) as pool:
        yield {bench: pool.submit(smoke, bench) for bench in chosen}


@pytest.mark.timeout(1020)  # above the smoke run's own bound (900 s, then its stop); each waits for its own run
@pytest.mark.parametrize("bench", BENCHMARKS, ids=lambda p: p.stem)
def test_the_benchmark_runs_and_prints_sane_figures(bench: Path, runs: dict[Path, Future]) -> None:
    done = runs[bench].result()
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.startswith("load average"), done.stdout
    assert judged(done.stdout) == [], done.stdout
    print(done.stdout)


def line(name: str, value: object, sane: object = (0, 10), control: str | None = None) -> str:
    return json.dumps({"figure": name, "value": value, "unit": "ms", "sane": sane, "control": control})


@pytest.mark.parametrize(("printed", "problems"), [
    ([line("added", 0.4, (-2, 50), "added, control"), line("added, control", -0.3, (-2, 50))], []),
    (["load average 1.0", "added TTFT -43.58 ms"], ["no figure printed as a JSON line"]),
    ([line("added", -43.58, (-6.5, 2000), "added, control"), line("added, control", -0.3, (-6.5, 2000))],
     ["'added': -43.58 ms outside its sane range -6.5..2000"]),
    ([line("added", 0.4, (-2, 50), "added, control")], ["'added': its control 'added, control' is not printed"]),
    ([line("ratio", float("nan"))], ["'ratio': nan is not a finite number"]),
    ([line("ratio", float("inf"))], ["'ratio': inf is not a finite number"]),
    ([line("ratio", None)], ["'ratio': None is not a finite number"]),
    ([line("ratio", 1.0, (0, float("inf")))], ["'ratio': sane range [0, inf] is not two finite bounds, low < high"]),
    ([line("ratio", 1.0, None)], ["'ratio': sane range None is not two finite bounds, low < high"]),
    ([line("ratio", 1.0), line("ratio", 1.1)], ["'ratio' printed twice"]),
])
def test_the_smoke_check_names_each_insane_figure(printed: list[str], problems: list[str]) -> None:
    assert judged("\n".join(printed)) == problems
