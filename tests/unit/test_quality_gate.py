"""The quality gate's pure parts (issue 49): the judge against a floor and against the last passing
run, `expectations.quality` in a stack file and its errors, lm-eval's results read, the shipped
task's items, and the simulated engine's answers to them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.bench import quality
from sparkctl.bench.gate import GateFailed, Verdict, judge_quality
from sparkctl.bench.quality_task import arith
from sparkctl.errors import SparkctlError
from sparkctl.sim import quality as sim_quality
from sparkctl.sim.engine import Faults
from sparkctl.spec.models import Quality
from sparkctl.state.quality import QualityRun


def run(accuracy: float | None, *, id: int = 2, items: int = 200, stderr: float | None = 0.02,
        error: str | None = None) -> QualityRun:
    return QualityRun(id, "s", "fp", {}, "sparkctl_arith", items, 0.0, 1.0, accuracy, stderr, "lm-eval 0.4.13", "",
                      error, None)


# (case, accuracy, expectations, baseline accuracy or None, words of each reason; none: a pass)
CASES = [
    ("over-the-floor", 0.90, {"floor": 0.7}, None, []),
    ("on-the-floor", 0.70, {"floor": 0.7}, None, []),
    ("under-the-floor", 0.31, {"floor": 0.7},
     None, ["sparkctl_arith accuracy 31.0% ± 2.0% over 200 items (lm-eval 0.4.13) < 70.0% floor"]),
    ("drop-within", 0.86, {"max_drop": 0.05}, 0.90, []),
    ("drop-exactly-allowed", 0.85, {"max_drop": 0.05}, 0.90, []),
    ("drop-past", 0.80, {"max_drop": 0.05}, 0.90,
     ["is 10 points under last passing quality run 1 (90.0%); at most 5 allowed"]),
    ("drop-without-baseline", 0.40, {"max_drop": 0.05}, None, []),
    ("both", 0.50, {"floor": 0.7, "max_drop": 0.05}, 0.90, ["< 70.0% floor", "40 points under"]),
    ("nothing-right", 0.0, {"floor": 0.7}, None, ["< 70.0% floor", "no answer was right"]),
]


@pytest.mark.parametrize(("accuracy", "expect", "before", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_judge(accuracy, expect, before, words) -> None:
    baseline = run(before, id=1) if before is not None else None
    verdict = judge_quality(run(accuracy), Quality(**expect), baseline=baseline)
    assert verdict.passed is (not words), verdict.reasons
    assert len(verdict.reasons) == len(words), verdict.reasons
    for reason, word in zip(verdict.reasons, words, strict=True):
        assert word in reason, reason


def test_a_run_that_measured_nothing_fails_with_its_error() -> None:
    verdict = judge_quality(run(None, error="lm-eval exited with code 1"), Quality(floor=0.5))
    assert verdict.reasons == ("sparkctl_arith was not measured: lm-eval exited with code 1",)


def test_a_quality_verdict_names_its_run_as_a_quality_run_apart_from_benchmark_runs() -> None:
    verdict = judge_quality(run(0.31, id=7), Quality(floor=0.7))
    assert verdict.describe().endswith("< 70.0% floor (quality run 7)")
    assert str(GateFailed(verdict)).startswith("quality gate: fail: sparkctl_arith accuracy 31.0%")
    assert str(GateFailed(Verdict(7, ("slow",)))) == "benchmark gate: fail: slow (run 7)"


def test_the_run_is_never_its_own_baseline() -> None:
    assert judge_quality(run(0.5), Quality(max_drop=0.05), baseline=run(0.9)).passed


SPEC = "name: a\nextends: qwen36-nvfp4-stock\nexpectations:\n  quality:\n"
# (case, lines under `quality:`, the key the error names, its words)
SPEC_CASES = [
    ("no-gate", "    task: sparkctl_arith\n", "expectations.quality", "set `floor`"),
    ("unknown-key", "    floor: 0.7\n    minimum: 0.5\n", "expectations.quality.minimum", "unknown key"),
    ("floor-above-one", "    floor: 70\n", "expectations.quality.floor", "less than or equal to 1"),
    ("drop-of-one", "    max_drop: 1\n", "expectations.quality.max_drop", "less than 1"),
    ("no-items", "    floor: 0.7\n    items: 0\n", "expectations.quality.items", "greater than or equal to 1"),
    ("bad-task", "    floor: 0.7\n    task: ../x\n", "expectations.quality.task", "should match pattern"),
]


@pytest.mark.parametrize(("lines", "key", "words"), [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_a_malformed_quality_section_gives_one_clear_line(workspace: Path, cli, lines, key, words) -> None:
    (workspace / "stacks" / "a.yaml").write_text(SPEC + lines)
    code, out, err = cli("stacks", "validate")
    assert code == 1, out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: ") and f": {key}" in err and words in err, err


def test_a_quality_section_loads_with_its_defaults(workspace: Path, cli) -> None:
    (workspace / "stacks" / "a.yaml").write_text(SPEC + "    floor: 0.7\n")
    code, out, err = cli("stacks", "validate")
    assert (code, err) == (0, ""), err
    assert Quality(floor=0.7) == Quality(task="sparkctl_arith", items=200, floor=0.7)


def test_lm_evals_results_are_read_for_the_accuracy_its_error_the_items_and_the_version() -> None:
    results = {"results": {"sparkctl_arith": {"alias": "sparkctl_arith", "exact_match,last-answer": 0.915,
                                              "exact_match_stderr,last-answer": 0.0198, "sample_len": 200}},
               "n-samples": {"sparkctl_arith": {"original": 200, "effective": 150}}, "lm_eval_version": "0.4.13"}
    got = quality.measured(results, "sparkctl_arith")
    assert (got.accuracy, got.stderr, got.items, got.tool) == (0.915, 0.0198, 150, "lm-eval 0.4.13")
    with pytest.raises(SparkctlError, match="no exact-match score for gsm8k.*they have: nothing"):
        quality.measured(results, "gsm8k")


def test_the_shipped_items_are_what_the_generator_makes_with_exact_answers() -> None:
    lines = arith.DATA.read_text().splitlines()
    assert [json.loads(line) for line in lines] == arith.generate()  # regenerate: python -m ...quality_task.arith
    assert len(lines) == arith.ITEMS == 200
    item = json.loads(lines[0])
    assert item["question"].startswith("Compute ") and item["answer"].lstrip("-").isdigit()
    assert quality.shipped("sparkctl_arith") and not quality.shipped("gsm8k")


def test_the_sim_answers_each_shipped_question_at_its_accuracy_the_same_way_every_time() -> None:
    items = arith.generate()
    prompt = "<|user|>{}\n<|assistant|>"

    def right(accuracy: float) -> set[int]:
        return {i["id"] for i in items
                if sim_quality.answer(prompt.format(i["question"]), accuracy) == f"Answer: {i['answer']}"}

    high, low = right(0.9), right(0.3)
    assert 0.85 <= len(high) / len(items) <= 0.95 and 0.25 <= len(low) / len(items) <= 0.35
    assert low < high  # a lower accuracy: a subset of the same questions right
    assert right(0.9) == high and right(1.0) == {i["id"] for i in items} and not right(0.0)
    wrong = sim_quality.answer(prompt.format(items[0]["question"]), 0.0)
    assert wrong is not None and 1 <= abs(int(wrong.split()[-1]) - int(items[0]["answer"])) <= 10


@pytest.mark.parametrize("prompt", ["Tell me a story.", "Compute the meaning of life.", "Compute __import__('os').",
                                    "Compute 2 ** 3.", "Compute " + "9 * " * 60 + "9."])
def test_the_sim_works_out_only_integer_arithmetic(prompt) -> None:
    assert sim_quality.answer(prompt, 1.0) is None


def test_the_accuracy_fault_is_a_fraction() -> None:
    assert Faults.parse("accuracy=0.3,crash_after=2") == Faults(accuracy=0.3, crash_after=2)


# (case, lm-eval's output, words of the message)
FAILURES = [
    ("not-installed", "Traceback ...\nModuleNotFoundError: No module named 'lm_eval'\n",
     "pip install 'sparkctl[quality]'"),
    ("unknown-task", "loading...\nunknown task: lm-eval 0.4.13 has no task 'nosuch' (`lm-eval ls tasks` lists them)\n",
     "lm-eval 0.4.13 has no task 'nosuch'"),
    ("refused", "API request failed! Status code: 401, Response text: {\"error\": ...}. Retrying...\nTraceback\n",
     "the endpoint refused lm-eval's requests: API request failed! Status code: 401"),
    ("other", "a\nb\nRuntimeError: boom\n",
     "lm-eval exited with code 1: a | b | RuntimeError: boom; see /r/lm-eval.log"),
]


@pytest.mark.parametrize(("output", "words"), [c[1:] for c in FAILURES], ids=[c[0] for c in FAILURES])
def test_a_failed_lm_eval_run_says_why_and_what_to_do(output, words) -> None:
    assert words in quality.failure(1, output, log=Path("/r/lm-eval.log"))


@pytest.mark.parametrize(("task", "offline", "datasets"), [
    ("sparkctl_arith", True, "run"),  # ours: nothing to fetch, the Hugging Face libraries offline
    ("gsm8k", False, "cache"),  # the Hub's: fetched once into the HF cache, kept like the weights
])
def test_a_hub_task_keeps_its_dataset_in_the_hf_cache_and_ours_runs_offline(tmp_path: Path, monkeypatch, task: str,
                                                                            offline: bool, datasets: str) -> None:
    seen: dict[str, str] = {}

    def child(command: list[str], *, env: dict[str, str], **_: object) -> object:
        seen.update(env)
        (tmp_path / "run" / "results.json").write_text(json.dumps({"results": {task: {}}}))
        raise SparkctlError("stop here: the child's environment is what is under test")

    monkeypatch.setattr(quality.subprocess, "run", child)
    endpoint = quality.Endpoint("http://127.0.0.1:9/v1", "s", api_key="k")
    with pytest.raises(SparkctlError, match="stop here"):
        quality.measure(endpoint, Quality(task=task, items=5, floor=0.5), folder=tmp_path / "run",
                        datasets=tmp_path / "cache" / "datasets")
    assert (seen.get("HF_DATASETS_OFFLINE") == "1") is offline
    assert seen["HF_DATASETS_CACHE"].startswith(str(tmp_path / datasets))
    assert seen["OPENAI_API_KEY"] == "k" and "HF_TOKEN" not in seen
