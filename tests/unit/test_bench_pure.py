"""The benchmark's pure parts: engine-counter deltas, profiles within a context window, the gate."""

from __future__ import annotations

import pytest

from sparkctl.bench import metrics, runner
from sparkctl.bench.gate import judge
from sparkctl.bench.profiles import PROFILES
from sparkctl.spec.models import Expectations
from sparkctl.state.bench import BenchRun

BEFORE = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{model_name="m"} 10
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 80
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 40
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 9
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 7
"""
AFTER = BEFORE.replace(" 10\n", " 110\n").replace(" 80\n", " 880\n").replace(" 40\n", " 440\n") \
    .replace('"0"} 9', '"0"} 99').replace('"1"} 7', '"1"} 57')


def test_counter_deltas_give_acceptance_length_and_per_position() -> None:
    stats = metrics.between(metrics.parse(BEFORE), metrics.parse(AFTER))
    assert stats.acceptance == pytest.approx(0.5) and stats.acceptance_length == pytest.approx(5.0)
    assert stats.per_position == (0.9, 0.5) and stats.committed_per_step is None


def test_diffusion_committed_tokens_per_step() -> None:
    before = metrics.parse("vllm:diffusion_num_committed_tokens 100\nvllm:diffusion_num_denoising_steps 10\n")
    after = metrics.parse("vllm:diffusion_num_committed_tokens 420\nvllm:diffusion_num_denoising_steps 50\n")
    assert metrics.between(before, after).committed_per_step == 8.0


def test_profiles_keep_the_depths_that_fit_the_window() -> None:
    assert PROFILES["seed"].within(32768).depths[-1] == 24576
    assert PROFILES["quick"].within(None).depths == (0, 4096, 16384)
    assert PROFILES["quick"].within(600).depths == (0,)


def test_a_test_fails_on_a_failed_request_not_on_a_rate_it_could_not_time() -> None:
    """llama-benchy reports decode 0 when every token came in one network read (a fast engine):
    that is an untimed rate; a request that ended with an error is the failure."""
    progress = runner.Progress()
    for line in ('{"type": "request_start", "context_size": 0, "concurrency": 1}',
                 '{"type": "request_end", "total_tokens": 128, "decode_seconds": 0, "error": ""}',
                 '{"type": "request_start", "context_size": 0, "concurrency": 16}',
                 '{"type": "request_end", "total_tokens": 0, "decode_seconds": 0, "error": "Connection reset"}'):
        runner._follow(line, progress, None)
    tests = [{"context_size": 0, "concurrency": c, "tg_throughput": {"mean": tg}} for c, tg in ((1, 0.0), (16, 9.0))]
    rows = runner._rows({"benchmarks": tests}, PROFILES["quick"], [], errored=progress.errored)
    assert [(r.concurrency, r.failed) for r in rows] == [(1, False), (16, True)]


def run(rows: list[dict], id_: int = 2) -> BenchRun:
    return BenchRun(id_, "s", "f", {"image": "sha256:" + "a" * 64}, "quick", "", 0, 1, None, None, rows)


def row(depth: int = 0, tg: float = 20.0, acceptance: float | None = 0.6, concurrency: int = 1, failed=False) -> dict:
    return {"depth": depth, "concurrency": concurrency, "tg_tps": tg, "acceptance": acceptance, "failed": failed}


@pytest.mark.parametrize(("rows", "expect", "baseline", "reason"), [
    ([row()], Expectations(min_decode_tps=18), None, None),
    ([row(tg=10)], Expectations(min_decode_tps=18), None, "decode 10.0 tok/s < 18 floor at depth 0"),
    ([row(tg=0.0)], Expectations(min_decode_tps=18), None, None),  # untimed, not slow
    ([row(acceptance=0.1)], Expectations(min_acceptance=0.4), None, "acceptance 0.10 < 0.40 floor"),
    ([row(tg=15)], Expectations(max_drop=0.1), run([row(tg=20)], 1), "25% under known-good run 1"),
    ([row(tg=19)], Expectations(max_drop=0.1), run([row(tg=20)], 1), None),
    ([row(), row(concurrency=16, failed=True)], Expectations(min_concurrency=16), None,
     "requests failed at concurrency 16"),
    ([row(), row(concurrency=32, failed=True)], Expectations(min_concurrency=16), None, None),
])
def test_the_gate(rows, expect, baseline, reason) -> None:
    verdict = judge(run(rows), expect, baseline=baseline)
    assert verdict.passed is (reason is None)
    if reason:
        assert reason in verdict.describe() and verdict.describe().endswith("(run 2)")
