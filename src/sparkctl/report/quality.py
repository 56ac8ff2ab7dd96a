"""The report's Quality section: each config's quality run (`bench/quality.py`) beside its
benchmark: the task, the items scored, the accuracy with its 95 % confidence interval, the tool
that measured it and its version, the fingerprint of the deployment it measured and the quality
gate's verdict. `chosen` picks the run from the store (the newest one of the benchmarked
deployment's fingerprint, else the stack's newest); `section` is pure."""

from __future__ import annotations

from sparkctl.state.bench import BenchRun
from sparkctl.state.quality import QualityRun
from sparkctl.state.store import Store


def chosen(store: Store, run: BenchRun) -> QualityRun | None:
    """The quality run to report beside the benchmark `run`: of the same deployment if there is one."""
    runs = store.quality.runs(run.stack)  # newest first
    return next((q for q in runs if q.fingerprint == run.fingerprint), runs[0] if runs else None)


def section(runs: dict[str, QualityRun], fingerprints: dict[str, str | None]) -> list[str]:
    """The markdown lines (none without a quality run); `fingerprints`: each config's benchmarked one."""
    if not runs:
        return []
    out = ["## Quality", "",
           "Accuracy measured through the OpenAI API with the tool named; the interval is ± 1.96 standard errors.",
           "", "| config | quality run | task | items | accuracy (95% CI) | tool | fingerprint | verdict |",
           "|---|---|---|---|---|---|---|---|"]
    for config, q in runs.items():
        other = " (not the benchmarked deployment)" if q.fingerprint != fingerprints.get(config) else ""
        out.append(f"| {config} | {q.id} | {q.task} | {q.items} | {_accuracy(q)} | {q.tool or '-'} | "
                   f"`{(q.fingerprint or '-')[:12]}`{other} | {_cell(q.verdict or q.error or 'unfinished')} |")
    return [*out, ""]


def _accuracy(run: QualityRun) -> str:
    if run.accuracy is None:
        return "not measured"
    interval = run.interval()
    return f"{run.accuracy * 100:.1f}%" + (f" ({interval[0] * 100:.1f}–{interval[1] * 100:.1f}%)" if interval else "")


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")
