"""The report's "Greedy drift" section: each reported stack's newest greedy run (`bench/drift.py`)
against its last passing build and, for a speculative stack, its no-spec twin, with the drift
gate's verdict where it refused the run. `report.compare` adds it to comparison.md."""

from __future__ import annotations

from collections.abc import Sequence

from sparkctl.bench import drift
from sparkctl.state.store import Store


def section(store: Store, stacks: Sequence[str]) -> list[str]:
    """The section's markdown lines; none when no stack has greedy outputs stored."""
    out = []
    for name in dict.fromkeys(stacks):
        newest = store.greedy.runs(name, limit=1)
        if not newest:
            continue
        run = newest[0]
        found = drift.review(run, store.greedy.passed(prompts=run.prompts, model=run.model))
        out += [f"- {name}: {line}" for line in found.lines]
        if run.verdict and run.verdict != "pass":
            out.append(f"- {name}: refused by its drift gate: {run.verdict.removeprefix('fail: ')}")
    return ["## Greedy drift (temperature 0, sparkctl's fixed prompts)", "", *out, ""] if out else []
