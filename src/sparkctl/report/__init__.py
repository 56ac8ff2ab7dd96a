"""The comparison report of benchmark runs: report.md, PNG graphs, dataset.csv/json.

`write` takes (stack spec, run) pairs, computes the twins, speedups, crossover and efficiency
(`analysis.py`), and writes everything into one folder. Called by `sparkctl bench report`,
the sweep and `make demo`.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

from sparkctl.report import dataset, markdown, plots
from sparkctl.report.analysis import Config
from sparkctl.spec.models import Stack
from sparkctl.state.bench import BenchRun


def write(entries: list[tuple[Stack, BenchRun]], folder: Path, *, bandwidth_gbs: float, title: str, label: str,
          bans: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    configs = [_config(stack, run) for stack, run in entries]
    runs = {stack.name: run for stack, run in entries}
    data = dataset.rows(configs, runs, bandwidth_gbs=bandwidth_gbs)
    dataset.write(data, folder)
    images = plots.draw(data, folder, subtitle=label)
    text = markdown.render(data, title=title, label=label, hardware=hardware(), bandwidth_gbs=bandwidth_gbs,
                           images=images, bans=bans or {})
    (folder / "report.md").write_text(text)
    return folder / "report.md"


def hardware() -> str:
    """The GPU if there is one (nvidia-smi), else the CPU, plus memory."""
    gpu = ""
    if shutil.which("nvidia-smi"):
        found = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                               capture_output=True, text=True, check=False)
        gpu = found.stdout.strip().replace("\n", "; ")
    cpu = next((line.split(":", 1)[1].strip() for line in _read("/proc/cpuinfo").splitlines()
                if line.startswith("model name")), platform.processor() or platform.machine())
    mem = next((int(line.split()[1]) // (1024 * 1024) for line in _read("/proc/meminfo").splitlines()
                if line.startswith("MemTotal")), 0)
    where = f"GPU {gpu}" if gpu else "no GPU"
    return f"{where}; {os.cpu_count()} x {cpu}; {mem} GiB RAM; {platform.system()} {platform.release()}"


def _config(stack: Stack, run: BenchRun) -> Config:
    model = (stack.model.repo or stack.model.path or "") if stack.model else ""
    decode = {r["depth"]: r["tg_tps"] for r in run.rows if r["concurrency"] == 1}
    return Config(stack.name, model, stack.image.repository, stack.extends,
                  bool(stack.vllm and stack.vllm.speculative), stack.resources.read_per_token_gb, decode)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
