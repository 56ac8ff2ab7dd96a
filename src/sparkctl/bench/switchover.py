"""The switch-over gate: what a switch measures of its new stack (`switch.bench: gate` before the
alias moves, `after` once it has). The `quick` benchmark through the gateway, judged by the speed
gate; then, when the stack sets `expectations.quality`, its quality gate (`quality.assess`, lm-eval
through the gateway). Only when both pass does the benchmark run become known-good and pin the
image digest, so a digest that failed the quality gate was never known-good and is blacklisted as
one that failed the speed gate is. Then its greedy outputs are stored and compared with its last
build's and its no-spec twin's (`drift.record_and_compare`: reported, refused only where the
stack's `expectations.drift` asks). A failure raises GateFailed with the failing gate's verdict.
Called by the daemon's switch (`daemon/verdicts.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sparkctl.bench import drift, quality
from sparkctl.bench import stack as bench_stack
from sparkctl.bench.gate import GateFailed
from sparkctl.bench.profiles import PROFILES
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store

if TYPE_CHECKING:
    from sparkctl.adapters.docker import DockerEngine


def measure(stack: Stack, *, settings: Settings, store: Store, docker: DockerEngine | None = None,
            note: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Run the stack's switch-over gates; the summary of what passed (`run`, `verdict`, `summary`,
    `quality` when it has a quality gate, `drift`: the greedy drift's lines), or GateFailed."""
    note(f"switch-over benchmark of {stack.name} (quick profile)")
    run = bench_stack.benchmark(stack, settings=settings, store=store, via_gateway=True, profile=PROFILES["quick"],
                                docker=docker)
    verdict = bench_stack.gate(stack, run, store=store, pin=False)
    if not verdict.passed:
        raise GateFailed(verdict)
    decode = ", ".join(f"{r['tg_tps']:.1f} tok/s at depth {r['depth']}" for r in run.rows)
    done: dict[str, Any] = {"run": run.id, "verdict": verdict.describe(),
                            "summary": f"run {run.id}: {decode}; passed its gate"}
    if (expect := stack.expectations.quality) is not None:
        note(f"quality gate of {stack.name} ({expect.task}, {expect.items} items)")
        checked, judged = quality.assess(stack, settings=settings, store=store)
        if not judged.passed:
            raise GateFailed(judged)
        done["quality"] = {"run": checked.id, "verdict": judged.describe(), "accuracy": checked.accuracy}
        done["summary"] += f"; quality run {checked.id}: {checked.summary()}; passed its gate"
    note(f"greedy drift of {stack.name}")
    done["drift"] = list(drift.record_and_compare(stack, settings=settings, store=store).lines)
    bench_stack.known_good(stack, run, store=store)
    return done

