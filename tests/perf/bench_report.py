"""Report figure: generating the comparison report (dataset, four PNG graphs, comparison.md) for a
9-config x 14-depth dataset with seed 000's shape, beside the 10 s goal. Median of 3, each in a
fresh process (matplotlib's import included, as a user's `sparkctl bench report` pays it).

Run with `make perf` (or `.venv/bin/python tests/perf/bench_report.py`).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import figure, load, runs, spread  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
ONE_RUN = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from sparkctl.state.store import Store
from tests.seedshape import seed_study
entries = seed_study(Store(Path({tmp!r}) / "s.db"))
start = time.perf_counter()
from sparkctl import report
report.write(entries, Path({tmp!r}) / "out", bandwidth_gbs=273.0, title="seed 000", label="synthetic")
print(time.perf_counter() - start)
"""


def main() -> None:
    print(load())
    times = []
    for _ in range(runs(3)):
        with tempfile.TemporaryDirectory() as tmp:
            out = subprocess.run([sys.executable, "-c", ONE_RUN.format(root=str(ROOT), tmp=tmp)], check=True,
                                 capture_output=True, text=True).stdout
            times.append(float(out.split()[-1]))
    print(f"report generation, 9 configs x 14 depths: {spread(times, digits=2)} (goal <= 10 s: "
          f"{'ok' if statistics.median(times) <= 10 else 'MISSED'})")
    figure("report generation", statistics.median(times), "s", sane=(0.05, 600))


if __name__ == "__main__":
    main()
