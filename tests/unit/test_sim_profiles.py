"""The simulated engine's profiles: the DFlash cliff between seed 000's measured points, the
profile each shipped stack runs on, and the calibration to the seeds' figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.sim.profiles import PROFILES, at, auto_profile, kv_capacity
from sparkctl.spec.load import load_catalog

ROOT = Path(__file__).resolve().parents[2]
CATALOG = load_catalog(ROOT / "stacks", ROOT / "patches")
GIB_PER_GB = 1e9 / 2**30

# Each DFlash profile with seed 000's cliff, and its no-speculation twin (same weights, no draft).
TWINS = [("qwen36-dflash-n8", "qwen36-nvfp4"), ("qwen36-bf16-dflash-n8", "qwen36-bf16"),
         ("qwen36-dflash-n1", "qwen36-bf16")]


@pytest.mark.parametrize(("dflash", "nospec"), TWINS)
def test_dflash_falls_off_the_cliff_right_past_8k(dflash: str, nospec: str) -> None:
    """Seed 000:5: fast through 8k, "collapses below baseline past ~8k": a sharp cliff, not the
    slow slope a straight line from 8192 to 12288 would draw."""
    fast, slow = PROFILES[dflash], PROFILES[nospec]
    points = {depth - 640: tps for depth, tps in fast.decode}  # each seed point at the depth it was measured at
    assert fast.benchmarked_tps(8192) == points[8192] > slow.benchmarked_tps(8192)  # as the seed measured it
    # The seed's depth-8192 test decoded with up to 8192 + 512 prompt + 256 generated tokens of context.
    assert fast.decode_tps(8192 + 512 + 256) == points[8192]
    for depth in (fast.cliff + 1, 10240, 12287, 12288, 16384, 65536):
        assert fast.decode_tps(depth) < slow.decode_tps(depth), depth
    assert fast.benchmarked_tps(12288) == points[12288]
    for depth in (0, 6144, 30000):  # away from the cliff: linear between the measured points, as before
        assert fast.decode_tps(depth) == at(fast.decode, depth)


CURVE = ((0, 20.0), (8000, 10.0), (12000, 4.0), (16000, 2.0))


@pytest.mark.parametrize(("depth", "stepped", "linear"), [
    (0, 20.0, 20.0), (4000, 15.0, 15.0), (8000, 10.0, 10.0), (9000, 10.0, 8.5), (9001, 4.0, 8.4985),
    (11000, 4.0, 5.5), (12000, 4.0, 4.0), (14000, 3.0, 3.0), (99999, 2.0, 2.0)])
def test_a_cliff_holds_the_value_before_it_then_steps_to_the_next_point(depth: int, stepped: float,
                                                                        linear: float) -> None:
    assert at(CURVE, depth, cliff=9000) == pytest.approx(stepped)
    assert at(CURVE, depth) == pytest.approx(linear)


@pytest.mark.parametrize(("stack", "profile"), [
    ("qwen36-dflash", "qwen36-dflash-n8"), ("qwen36-bf16-dflash-n8", "qwen36-bf16-dflash-n8"),
    ("qwen36-bf16-dflash-n1", "qwen36-dflash-n1"), ("qwen36-dflash-v4", "qwen36-dflash-v4"),
    ("qwen36-nvfp4-stock", "qwen36-nvfp4"), ("qwen36-bf16-aeon", "qwen36-bf16"),
    ("aeon-gemma4-v2", "aeon-gemma4-v2"), ("aeon-gemma4-v2-262k", "aeon-gemma4-v2"),
    ("aeon-gemma4-v2-nospec", "aeon-gemma4-nospec"),
    ("diffusiongemma", "diffusiongemma")])
def test_each_shipped_stack_runs_on_its_profile(stack: str, profile: str) -> None:
    assert _profile_of(stack).name == profile


def test_the_month_stable_qwen_is_calibrated_to_seed_003() -> None:
    """Seed 003: 35-57 tok/s with DFlash at 7 tokens, 64.8% acceptance, ~21 GB model + 3.2 GB
    drafter, ~322K KV tokens (at the stack's own memory fraction)."""
    v4 = PROFILES["qwen36-dflash-v4"]
    speeds = [v4.decode_tps(d) for d in range(0, 262145, 4096)]
    assert max(speeds) == 57.0 and min(speeds) == 35.0
    assert v4.acceptance == 0.648 and v4.cliff is None
    assert v4.weights_gib == pytest.approx((21 + 3.2) * GIB_PER_GB, abs=0.1)
    assert CATALOG.stack("qwen36-dflash-v4").vllm.speculative.num_speculative_tokens == 7


@pytest.mark.parametrize(("stack", "seed_kv_tokens"), [
    ("qwen36-dflash-v4", 322_000), ("aeon-gemma4-v2", 340_000), ("aeon-gemma4-v2-262k", 340_000),
    ("diffusiongemma", 3_590_000)])
def test_kv_capacity_at_the_stacks_fraction_matches_the_seed_and_its_expectation(stack: str,
                                                                                  seed_kv_tokens: int) -> None:
    spec = CATALOG.stack(stack)
    tokens = kv_capacity(_profile_of(stack), spec.resources.gpu_memory_utilization)
    assert tokens == pytest.approx(seed_kv_tokens, rel=0.02)
    assert tokens >= spec.expectations.min_kv_tokens


def test_gemma4s_no_spec_stack_carries_the_seeds_81_and_the_dflash_one_an_estimate() -> None:
    """81 tok/s is seed 003's figure without speculation (seed 003:104), on the no-spec stack; the
    seed gives none with DFlash on, so the DFlash profile's decode is the no-spec curve, an estimate."""
    nospec, dflash = PROFILES["aeon-gemma4-nospec"], PROFILES["aeon-gemma4-v2"]
    assert nospec.decode_tps(0) == 81.0 and nospec.acceptance == 0.0
    assert CATALOG.stack("aeon-gemma4-v2-nospec").expectations.seed_decode_tps == 81.0
    assert CATALOG.stack("aeon-gemma4-v2").expectations.seed_decode_tps is None  # no reference line: not measured
    assert dflash.decode == nospec.decode and dflash.weights_gib - nospec.weights_gib == pytest.approx(1 * GIB_PER_GB)


def _profile_of(name: str):
    stack = CATALOG.stack(name)
    spec = stack.vllm.speculative if stack.vllm else None
    return PROFILES[auto_profile(stack.model.repo, spec.model_dump() if spec else {})]
