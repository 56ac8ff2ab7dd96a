"""The comparison report of benchmark runs, laid out as seed 000's study folder: comparison.md,
graphs/ (PNGs), results/ (each run's raw llama-benchy JSON as `<config>.json`) and
dataset.csv/json.

`write` takes (stack spec, run) pairs, reads each run folder's environment.json (the machine,
engine and settings it ran with; absent for older runs), computes the twins, speedups, crossover
and efficiency (`analysis.py`) and the headline (`headline.py`), and writes everything into one
folder. Called by `sparkctl bench report`, the sweep and `make demo`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from sparkctl.errors import SparkctlError
from sparkctl.report import dataset, environment, markdown, plots
from sparkctl.report.analysis import Config
from sparkctl.report.environment import Entry
from sparkctl.settings import Settings
from sparkctl.spec.imagefile import policy_for
from sparkctl.spec.models import Stack
from sparkctl.state.bench import BenchRun

REPORT = "comparison.md"


def compare(entries: list[tuple[Stack, BenchRun]], settings: Settings, *, label: str = "",
            folder: Path | None = None) -> Path:
    """The report of these runs (`sparkctl bench report` and sweep, the dashboard's Compare), with
    the bans of the images they used, in `folder` (else a new one in the state dir's reports/);
    returns the path of comparison.md."""
    blacklist = policy_for(settings).blacklist
    if not entries:
        raise SparkctlError("nothing to report: no benchmark runs (`sparkctl bench run STACK`)")
    repos = {stack.image.repository for stack, _ in entries}
    bans = {ref: ban.reason for ref, ban in blacklist.items()
            if ref.startswith("sha256:") or ref.rsplit(":", 1)[0] in repos}
    folder = folder or settings.state_dir / "reports" / time.strftime("%Y%m%d-%H%M%S")
    return write(entries, folder, bandwidth_gbs=settings.memory_bandwidth_gbs, label=label, bans=bans,
                 title="sparkctl benchmark report: " + ", ".join(s.name for s, _ in entries))


def write(entries: list[tuple[Stack, BenchRun]], folder: Path, *, bandwidth_gbs: float, title: str, label: str,
          bans: dict[str, str] | None = None) -> Path:
    """Write the report into `folder` (created); returns the path of comparison.md."""
    folder.mkdir(parents=True, exist_ok=True)
    studied = list({stack.name: Entry(stack, run, _environment(run)) for stack, run in entries}.values())
    configs = [_config(e) for e in studied]
    data = dataset.rows(configs, {e.stack.name: e.run for e in studied}, bandwidth_gbs=bandwidth_gbs)
    dataset.write(data, folder)
    (folder / "graphs").mkdir(exist_ok=True)
    images = plots.draw(data, folder / "graphs", subtitle=label)
    results = _copy_results(studied, folder / "results")
    text = markdown.render(studied, data, configs, title=title, label=label, bandwidth_gbs=bandwidth_gbs,
                           images=images, results=results, bans=bans or {})
    (folder / REPORT).write_text(text)
    return folder / REPORT


def _config(entry: Entry) -> Config:
    stack, run = entry.stack, entry.run
    decode = {r["depth"]: r["tg_tps"] for r in run.rows if r["concurrency"] == 1}
    return Config(stack.name, environment.model(stack), stack.image.repository, stack.extends,
                  bool(stack.vllm and stack.vllm.speculative), stack.resources.read_per_token_gb, decode,
                  engine=stack.image.ref, speculation=environment.speculation(stack, detail=False),
                  checkpoint=environment.checkpoint(stack))


def _environment(run: BenchRun) -> dict:
    """The run folder's environment.json, or {} (an older run, a moved folder, a torn file)."""
    if not run.folder:
        return {}
    try:
        found = json.loads((Path(run.folder) / "environment.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _copy_results(entries: list[Entry], results: Path) -> list[str]:
    """Each run's raw llama-benchy JSON as results/<config>.json; runs whose folder is gone are left out."""
    copied = []
    for stale in results.glob("*.json"):  # a report written here before, of other configs
        stale.unlink()
    for e in entries:
        raw = Path(e.run.folder) / "llama-benchy.json" if e.run.folder else None
        if raw is not None and raw.is_file():
            results.mkdir(exist_ok=True)
            shutil.copyfile(raw, results / f"{e.stack.name}.json")
            copied.append(f"{e.stack.name}.json")
    return copied
