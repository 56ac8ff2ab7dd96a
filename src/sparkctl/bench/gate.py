"""The regression gate: a benchmark run against the stack's `expectations` and its last
known-good run. Fails on decode below the floor at depth 0, a drop past `max_drop` against the
known-good run, speculative acceptance under the floor, or failed requests at or under the
declared concurrency (a retest counts every level it ran: `requalifying` takes it past the
point where the banned image fell over). The quality gate (`judge_quality`) beside it: an
accuracy under `expectations.quality.floor`, or more than its `max_drop` points under the
stack's last passing run on the same questions. Pure: the caller records the verdict and acts on it
(known-good pin, rollback, blacklist, a retest's ban kept or lifted)."""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.bench.profiles import PROFILES, Profile
from sparkctl.errors import SparkctlError
from sparkctl.spec.models import Expectations, Quality
from sparkctl.state.bench import BenchRun
from sparkctl.state.quality import QualityRun


@dataclass(frozen=True)
class Verdict:
    run: int  # the benchmark run judged, or for the quality gate the quality run
    reasons: tuple[str, ...] = ()
    gate: str = "benchmark"  # or "quality": which gate judged, so whose run `run` is

    @property
    def passed(self) -> bool:
        return not self.reasons

    def describe(self) -> str:
        """"pass", or "fail: <reasons> (run N)"; a quality verdict names its "quality run N"
        (its own numbering, apart from the benchmark runs')."""
        run = f"quality run {self.run}" if self.gate == "quality" else f"run {self.run}"
        return "pass" if self.passed else f"fail: {'; '.join(self.reasons)} ({run})"


class GateFailed(SparkctlError):
    def __init__(self, verdict: Verdict) -> None:
        super().__init__(f"{verdict.gate} gate: {verdict.describe()}")
        self.verdict = verdict


def judge(run: BenchRun, expect: Expectations, *, baseline: BenchRun | None = None,
          up_to: int | None = None) -> Verdict:
    """`up_to`: failed requests fail the gate at or under this concurrency (default: the stack's
    `min_concurrency`; with neither, at any)."""
    rows = [r for r in run.rows if r["concurrency"] == 1]
    reasons = []
    decode = next((r["tg_tps"] for r in rows if r["depth"] == 0), None) or None  # 0: llama-benchy could not time it
    if expect.min_decode_tps and decode is not None and decode < expect.min_decode_tps:
        reasons.append(f"decode {decode:.1f} tok/s < {expect.min_decode_tps:g} floor at depth 0")
    before = next((r["tg_tps"] for r in baseline.rows if r["depth"] == 0 and r["concurrency"] == 1), None) \
        if baseline and baseline.id != run.id else None
    if expect.max_drop and decode is not None and before and decode < before * (1 - expect.max_drop):
        reasons.append(f"decode {decode:.1f} tok/s is {1 - decode / before:.0%} under known-good run {baseline.id} "
                       f"({before:.1f}); at most {expect.max_drop:.0%} allowed")
    rates = [r["acceptance"] for r in rows if r.get("acceptance") is not None]
    if expect.min_acceptance and rates and (acceptance := sum(rates) / len(rates)) < expect.min_acceptance:
        reasons.append(f"acceptance {acceptance:.2f} < {expect.min_acceptance:.2f} floor")
    crashed = sorted({r["concurrency"] for r in run.rows if r.get("failed")
                      and r["concurrency"] <= (up_to or expect.min_concurrency or r["concurrency"])})
    if crashed:
        reasons.append(f"requests failed at concurrency {', '.join(map(str, crashed))}")
    return Verdict(run.id, tuple(reasons))


def judge_quality(run: QualityRun, expect: Quality, *, baseline: QualityRun | None = None) -> Verdict:
    """`run`'s accuracy against the floor and against `baseline`, the stack's last passing run on
    the same task and items; the reasons name what was measured, over how many items, and by what."""
    if run.accuracy is None:
        return Verdict(run.id, (f"{run.task} was not measured: {run.error or 'no result'}",), gate="quality")
    measured = f"{run.task} accuracy {_pct(run.accuracy)}" + (f" ± {_pct(run.stderr)}" if run.stderr else "") + \
        f" over {run.items} items ({run.tool})"
    reasons = []
    if expect.floor is not None and run.accuracy < expect.floor:
        reasons.append(f"{measured} < {_pct(expect.floor)} floor")
    before = baseline.accuracy if baseline is not None and baseline.id != run.id else None
    drop = round((before - run.accuracy) * 100, 6) if before is not None else 0.0  # points, without float noise
    if expect.max_drop is not None and before is not None and drop > round(expect.max_drop * 100, 6):
        reasons.append(f"{measured} is {drop:g} points under last passing quality run {baseline.id} "
                       f"({_pct(before)}); at most {expect.max_drop * 100:g} allowed")
    if reasons and run.accuracy == 0:
        reasons.append("no answer was right: the model answers, but wrongly or in no readable form (random "
                       "weights, a broken image, patch, quantization or draft)")
    return Verdict(run.id, tuple(reasons), gate="quality")


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.1f}%"


def requalifying(expect: Expectations, *, cap: int | None = None) -> Profile:
    """The benchmark a retest of a banned image runs: one stream at depth 0 (the decode floor and
    speculative acceptance), then the declared concurrency and twice it, past where the banned
    image fell over (without a declared one, the `concurrency` profile's levels). Levels over an
    enforced concurrency cap are left out: the gateway never lets that many through."""
    base = PROFILES["concurrency"]
    declared = expect.min_concurrency
    levels = (1, declared, 2 * declared) if declared else base.concurrency
    kept = tuple(sorted({c for c in levels if cap is None or c <= cap} | {1}))
    return Profile("retest", base.pp, base.tg, (0,), runs=1, concurrency=kept)
