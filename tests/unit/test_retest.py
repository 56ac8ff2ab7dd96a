"""A retest's pure parts: which stack measures a banned tag, the trial made of it, the benchmark
that goes past the failure point and the gate that counts it, and the reconciler leaving a held
trial alone. The real path (registry, engine, images.yaml) is tests/integration/test_retest.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkctl.bench.gate import judge, requalifying
from sparkctl.daemon.planner import History, Observed, Policy, Remove, plan
from sparkctl.deploy.retest import choose_stack, measured_stack, prepare, reported_spec, trial_name, trial_spec
from sparkctl.errors import NoSuchStack, SparkctlError
from sparkctl.policy.images import ImagePolicy, plan_retest
from sparkctl.spec.load import Catalog, load_catalog
from sparkctl.spec.models import Expectations, KnownIssue
from sparkctl.state.bench import BenchRun

ROOT = Path(__file__).resolve().parents[2]
GEMMA = "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash"
DIGEST = "sha256:" + "c" * 64


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(ROOT / "stacks", ROOT / "patches")


def _with(catalog: Catalog, name: str, **changes) -> Catalog:
    base = catalog.stack("aeon-gemma4-v2")
    return Catalog({**catalog.stacks, name: base.model_copy(update={"name": name, **changes})}, catalog.patch_sets)


def test_the_stack_that_runs_the_repository_measures_it(catalog: Catalog) -> None:
    assert choose_stack(catalog, f"{GEMMA}:latest").name == "aeon-gemma4-v2"  # not the ones extending it
    assert choose_stack(catalog, f"{GEMMA}:latest", "qwen36-dflash").name == "qwen36-dflash"  # as asked


def test_no_stack_or_several_ask_for_one(catalog: Catalog) -> None:
    with pytest.raises(SparkctlError, match="no stack runs docker.io/nobody/x.*--stack NAME"):
        choose_stack(catalog, "nobody/x:latest")
    twin = _with(catalog, "gemma-twin", extends=None)
    with pytest.raises(SparkctlError, match=r"2 stacks run .*\(aeon-gemma4-v2, gemma-twin\).*--stack NAME"):
        choose_stack(twin, f"{GEMMA}:latest")
    with pytest.raises(NoSuchStack):
        choose_stack(catalog, f"{GEMMA}:latest", "nope")


def test_the_trial_runs_the_digest_under_its_own_name_without_a_canary_floor(catalog: Catalog) -> None:
    stack = catalog.stack("aeon-gemma4-v2")
    retrial = plan_retest(ImagePolicy(blacklist={f"{GEMMA}:latest": {"reason": "x"}}), f"{GEMMA}:latest", DIGEST)
    trial = trial_spec(stack, retrial)
    assert trial.name == trial_name(stack.name) == "aeon-gemma4-v2.retest"
    assert measured_stack(trial.name) == stack.name and measured_stack(stack.name) is None
    assert trial.image.ref == f"{GEMMA}:latest@{DIGEST}" and trial.image.allow_latest
    assert trial.expectations.min_acceptance is None  # judged by the gate over the whole benchmark
    assert stack.expectations.min_acceptance == 0.40
    assert (trial.model, trial.draft, trial.vllm, trial.port) == (stack.model, stack.draft, stack.vllm, stack.port)


@pytest.mark.parametrize(("expect", "cap", "levels"), [
    (Expectations(min_concurrency=32), None, (1, 32, 64)),  # the declared level and past it
    (Expectations(min_concurrency=16), None, (1, 16, 32)),
    (Expectations(), None, (1, 4, 16, 32, 64)),  # nothing declared: the concurrency profile's levels
    (Expectations(min_concurrency=16), 20, (1, 16)),  # never past an enforced cap
    (Expectations(), 2, (1,)),
])
def test_the_retest_benchmark_goes_past_the_failure_point(expect, cap, levels) -> None:
    profile = requalifying(expect, cap=cap)
    assert profile.concurrency == levels and profile.depths == (0,)


def test_a_capped_stack_is_benchmarked_within_its_cap(catalog: Catalog) -> None:
    capped = catalog.stack("aeon-gemma4-v2").model_copy(update={"known_issues": (
        KnownIssue(text="crashes past 8", max_concurrency=8, source="seed 003:31"),)})
    assert max(requalifying(capped.expectations, cap=capped.max_concurrency).concurrency) <= 8


def _run(*failed_at: int) -> BenchRun:
    rows = [{"depth": 0, "concurrency": c, "tg_tps": 80.0, "acceptance": 0.6 if c == 1 else None,
             "failed": c in failed_at} for c in (1, 32, 64)]
    return BenchRun(3, "s.retest", None, {"image": DIGEST}, "retest", "", 0, 1, None, None, rows)


def test_a_retest_counts_failures_at_every_level_it_ran() -> None:
    expect = Expectations(min_concurrency=32, min_acceptance=0.4)
    assert judge(_run(64), expect).passed  # the normal gate: only up to the declared level
    verdict = judge(_run(64), expect, up_to=64)
    assert not verdict.passed and "requests failed at concurrency 64" in verdict.describe()
    assert judge(_run(), expect, up_to=64).passed


def test_a_pass_leaves_a_held_trial_alone_and_removes_it_once_released() -> None:
    observed = [Observed("s.retest", "c1", "running")]
    policy = Policy()
    held = plan((), {}, {}, observed, {"s.retest": History(busy=1)}, now=0.0, policy=policy)
    assert held.actions == ()
    released = plan((), {}, {}, observed, {"s.retest": History()}, now=0.0, policy=policy)
    assert released.actions == (Remove("c1", "no desired stack claims s.retest"),)


class _Docker:
    """The two things `prepare` asks Docker: the tag's digest now, and what runs."""

    def __init__(self, digest: str, running: tuple[str, ...] = ()) -> None:
        self.digest, self.running = digest, running

    def registry_digest(self, ref: str, *, mirrors) -> str:
        assert ref == f"{GEMMA}:latest"
        return self.digest

    def containers(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(stack=s, running=True) for s in self.running]


def _deployer(catalog: Catalog, docker: _Docker, ban: dict) -> SimpleNamespace:
    return SimpleNamespace(catalog=catalog, docker=docker, settings=SimpleNamespace(registry_mirrors={}),
                           policy=ImagePolicy(blacklist={f"{GEMMA}:latest": ban}))


def test_prepare_refuses_while_other_stacks_run_and_names_them(catalog: Catalog) -> None:
    docker = _Docker(DIGEST, running=("qwen36-dflash", "diffusiongemma"))
    with pytest.raises(SparkctlError, match="to itself, but diffusiongemma, qwen36-dflash are running.*sparkctl down"):
        prepare(f"{GEMMA}:latest", stack=None, force=False, deployer=_deployer(catalog, docker, {"reason": "x"}))
    trial = prepare(f"{GEMMA}:latest", stack=None, force=False,
                    deployer=_deployer(catalog, _Docker(DIGEST, running=("aeon-gemma4-v2.retest",)), {"reason": "x"}))
    assert (trial.stack.name, trial.spec.image.digest, trial.retrial.lift) == ("aeon-gemma4-v2", DIGEST,
                                                                               (f"{GEMMA}:latest",))


def test_prepare_stops_when_the_tag_has_not_moved_unless_forced(catalog: Catalog) -> None:
    deployer = _deployer(catalog, _Docker(DIGEST), {"reason": "x", "digest": DIGEST})
    with pytest.raises(SparkctlError, match="nothing changed.*--force"):
        prepare(f"{GEMMA}:latest", stack=None, force=False, deployer=deployer)
    assert prepare(f"{GEMMA}:latest", stack=None, force=True, deployer=deployer).retrial.digest == DIGEST


def test_a_trial_run_is_reported_with_the_stack_it_measured(catalog: Catalog) -> None:
    spec = reported_spec(catalog, "aeon-gemma4-v2.retest")
    assert spec.name == "aeon-gemma4-v2.retest" and spec.vllm == catalog.stack("aeon-gemma4-v2").vllm
    assert reported_spec(catalog, "aeon-gemma4-v2") == catalog.stack("aeon-gemma4-v2")
    with pytest.raises(NoSuchStack):
        reported_spec(catalog, "gone.retest")
