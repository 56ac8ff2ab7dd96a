"""Speed profiles of the simulated engine, calibrated to the seed studies (DGX Spark, GB10).

Decode and prefill speeds are piecewise-linear in context depth through measured points, except
across a draft head's cliff: seed 000 measured DSpark DFlash fast at depth 8192 and below no-spec
from 12288 on, "a sharp cliff consistent with the draft head running past its effective context"
(seed 000:5), so a profile with a `cliff` holds the value before it up to the cliff and drops
there at once to the next measured point, where linear interpolation takes over again.
Sleep-mode durations follow from the weights' size. Figures marked `measured` come from the
seeds; `estimate` marks a value the seeds don't give (documented in docs/engines.md). Pure
data plus interpolation; the engine (`engine.py`) and the sim's start-up (`main.py`) read it.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

Curve = tuple[tuple[int, float], ...]  # (context depth in tokens, tokens/s)
GB_IN_GIB = 1e9 / 2**30  # the Hub and the seeds give sizes in GB (10^9 bytes); memory counts GiB
# Qwen3.6-27B's KV tokens per GiB: seed 003's ~322K tokens for qwen36-dflash-v4 (at the stack's 0.80).
_QWEN_KV = 4_430.0


def at(curve: Curve, depth: int, *, cliff: int | None = None) -> float:
    """Linear interpolation through the curve's points, flat beyond both ends. In the span that
    holds the `cliff` depth, the value before it holds up to the cliff and the value after it
    applies right past it: a step, not a slope."""
    depths = [d for d, _ in curve]
    i = bisect_right(depths, depth)
    if i == 0:
        return curve[0][1]
    if i == len(curve):
        return curve[-1][1]
    (d0, v0), (d1, v1) = curve[i - 1], curve[i]
    if cliff is not None and d0 <= cliff < d1:
        return v0 if depth <= cliff else v1
    return v0 + (v1 - v0) * (depth - d0) / (d1 - d0)


@dataclass(frozen=True)
class Profile:
    name: str
    decode: Curve  # single-stream decode tok/s by depth
    prefill: Curve  # prefill tok/s by depth
    load_s: float  # weights from NVMe into unified memory, until the port opens
    compile_s: float = 0.0  # torch.compile / graph capture, after the weights, with no compile cache
    weights_gib: float = 20.0  # memory the weights take: fractions below it cannot start
    acceptance: float = 0.0  # speculative acceptance rate per drafted token
    block: int = 1  # tokens per streamed chunk (diffusion engines commit whole blocks)
    crash_above: int | None = None  # dies when more requests than this run at once
    kv_tokens_per_gib: float = _QWEN_KV  # per GiB of the fraction left after the weights
    # The depth past which the draft head runs beyond its effective context and decode falls
    # below no-spec at once (seed 000:5); None: decode follows the curve's slopes throughout.
    cliff: int | None = None
    # The share of sparkctl's quality task (`sparkctl_arith`) answered right (`quality.py`): the
    # seeds measure no accuracy, so every profile has this estimate; the `accuracy` fault overrides it.
    accuracy: float = 0.95

    def decode_tps(self, depth: int) -> float:
        return at(self.decode, depth, cliff=self.cliff)

    def prefill_tps(self, depth: int) -> float:
        return at(self.prefill, depth)

    def benchmarked_tps(self, depth: int, *, pp: int = 512, tg: int = 256) -> float:
        """What llama-benchy measures at `depth` (`--pp pp --tg tg`, seed 000's by default)."""
        return self.decode_tps(measured_at(depth, pp=pp, tg=tg))

    @property
    def cached_compile_s(self) -> float:
        """The compiled graphs loaded from vLLM's compile cache, on a later start."""
        return self.compile_s * _CACHED_COMPILE

    @property
    def copy_s(self) -> float:
        """Copying the weights between device and pinned host memory (level-1 sleep or wake)."""
        return self.weights_gib / _HOST_COPY_GIB_S

    @property
    def remap_s(self) -> float:
        """Unmapping the discarded allocations (sleep), or mapping them again (wake)."""
        return _REMAP_S

    @property
    def reload_s(self) -> float:
        """`collective_rpc reload_weights` after a level-2 wake: the weights again, from the page cache."""
        return self.load_s * _RELOAD_FRACTION


_UNIFIED_GIB = 119.0  # what the GB10 reports usable
# Sleep mode (all estimates, docs/engines.md): cudaMemcpy between device and pinned host
# memory, both in the GB10's LPDDR5x; unmapping or mapping the discarded allocations (one
# step each way); reloading the weights from the page cache against a cold load.
_HOST_COPY_GIB_S = 20.0
_REMAP_S = 0.5
# A later start loads the compiled graphs from vLLM's cache: seed 003's DiffusionGemma starts in
# 2 min with the compile cached against 31.5 s of compile cold; loading them takes ~5 s (estimate).
_CACHED_COMPILE = 5.0 / 31.5
_RELOAD_FRACTION = 0.1
_QWEN_PREFILL: Curve = ((0, 1800.0), (16384, 1500.0), (65536, 900.0))  # estimate
_MOE_PREFILL: Curve = ((0, 5200.0), (16384, 4400.0), (65536, 3000.0))  # estimate
# Seed 000 measured with llama-benchy --pp 512 --tg 256 (seed 000:18): its figure "at depth d" is
# the decode over contexts d + 512 to d + 768, so each of its points sits at the middle, d + 640,
# and llama-benchy run the seed's way measures the seed's figure at d (`Profile.benchmarked_tps`).
def measured_at(depth: int, *, pp: int, tg: int) -> int:
    """The context a llama-benchy figure at `depth` (`--pp pp --tg tg`) stands for: the middle of
    the contexts its test decoded over."""
    return depth + pp + tg // 2


def _seed_000(*points: tuple[int, float]) -> Curve:
    """Seed 000's (depth, tok/s) points, each at the context its figure was decoded at."""
    return tuple((measured_at(depth, pp=512, tg=256), tps) for depth, tps in points)


# Seed 000: decode is bandwidth-bound and equal across engines; NVFP4 8.9 tok/s, BF16 4.5 at
# depth 0; no-spec NVFP4 8.6 at 12k and 7.7 at 64k (measured); BF16 scaled alike.
_NVFP4 = _seed_000((0, 8.9), (12288, 8.6), (65536, 7.7))
_BF16 = _seed_000((0, 4.5), (12288, 4.35), (65536, 3.9))

# DSpark DFlash's cliff (seed 000:5, "past ~8k"): its last fast test, depth 8192, decoded with up
# to 8192 + 512 prompt + 256 generated = 8960 tokens of context, the first slow one (12288) from
# 12800 on. The draft head's effective context lies between; 9216 is the next 1K step past 8960.
_DSPARK_CLIFF = 9216
_DSPARK_GB = 4.0  # the DSpark draft's size: the seeds give none (estimate)
_GEMMA4: Curve = ((0, 81.0), (32768, 70.0), (262144, 48.0))  # 81 at depth 0 measured (seed 003:104), the rest estimate

PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("qwen36-nvfp4", _NVFP4, _QWEN_PREFILL, load_s=150, compile_s=40, weights_gib=23 * GB_IN_GIB),
    Profile("qwen36-bf16", _BF16, _QWEN_PREFILL, load_s=300, compile_s=40, weights_gib=51 * GB_IN_GIB),
    # DFlash n=8 on NVFP4: "21-26 tok/s through 8k" (measured as a range: its ends placed at depth 0
    # and 8192 are this project's reading, the seed gives no per-depth figure before 12k), then below
    # no-spec: 7.5 @12k, 5.7 @64k (measured).
    Profile("qwen36-dflash-n8", _seed_000((0, 26.0), (8192, 21.0), (12288, 7.5), (65536, 5.7)),
            _QWEN_PREFILL, load_s=170, compile_s=45, weights_gib=(23 + _DSPARK_GB) * GB_IN_GIB, acceptance=0.648,
            cliff=_DSPARK_CLIFF),
    # DFlash n=8 on BF16: the seeds give no figure; NVFP4's shape scaled to BF16's no-spec (estimate).
    Profile("qwen36-bf16-dflash-n8", _seed_000((0, 13.2), (4096, 11.9), (8192, 10.6), (12288, 3.8), (65536, 2.9)),
            _QWEN_PREFILL, load_s=320, compile_s=45, weights_gib=(51 + _DSPARK_GB) * GB_IN_GIB, acceptance=0.648,
            cliff=_DSPARK_CLIFF),
    # DFlash n=1 on BF16: the seeds give no figure; one draft token at ~65% acceptance, and past the
    # cliff a little under no-spec (one wasted draft token costs less than eight) (estimate).
    Profile("qwen36-dflash-n1", _seed_000((0, 6.9), (8192, 6.5), (12288, 4.1), (65536, 3.6)),
            _QWEN_PREFILL, load_s=320, compile_s=45, weights_gib=(51 + _DSPARK_GB) * GB_IN_GIB, acceptance=0.648,
            cliff=_DSPARK_CLIFF),
    # Seed 003's month-stable Qwen (image qwen36-v4, vLLM 0.20.2, DFlash at 7 tokens): 35-57 tok/s
    # with speculative decoding, acceptance 64.8%, model ~21 GB + drafter 3.2 GB, ~322K KV tokens
    # (measured). The seed gives a range, not a depth curve: 57 at depth 0 to 35 at its 256K context
    # is an estimate of shape, and the seed reports no cliff for this drafter. KV density: ~322K
    # tokens at the stack's 0.80 (this project's choice of fraction; the seed gives none).
    Profile("qwen36-dflash-v4", ((0, 57.0), (262144, 35.0)), _QWEN_PREFILL, load_s=140, compile_s=45,
            weights_gib=(21 + 3.2) * GB_IN_GIB, acceptance=0.648),
    # Seed 003: Aeon Gemma-4 without speculation, 81 tok/s single stream at depth 0 (measured, seed
    # 003:104; its depth curve is an estimate); weights 15.3 GB (seed 003:33). "54 tok/s with
    # thinking" is not modelled (docs/engines.md says why).
    Profile("aeon-gemma4-nospec", _GEMMA4, _MOE_PREFILL, load_s=90, compile_s=30, weights_gib=15.3 * GB_IN_GIB,
            kv_tokens_per_gib=4_250),
    # Aeon Gemma-4 + DFlash on v2: decode is an ESTIMATE, the no-spec curve (the seed gives no
    # DFlash-on figure for Gemma-4). Acceptance 55-62% (0.58), weights 15.3 GB + the 1 GB drafter,
    # KV ~340K tokens at 0.80 (measured, seed 003:33-39; the fraction is this project's choice).
    Profile("aeon-gemma4-v2", _GEMMA4, _MOE_PREFILL,
            load_s=90, compile_s=30, weights_gib=(15.3 + 1) * GB_IN_GIB, acceptance=0.58, kv_tokens_per_gib=4_250),
    # The broken `latest` of 2026-06-10: acceptance ~10%, crashes above 16 concurrent requests.
    Profile("aeon-gemma4-latest-broken", ((0, 44.0), (32768, 38.0), (262144, 26.0)), _MOE_PREFILL,
            load_s=90, compile_s=30, weights_gib=(15.3 + 1) * GB_IN_GIB, acceptance=0.10, crash_above=16,
            kv_tokens_per_gib=4_250),
    # Seed 003: 210 tok/s single stream, block-diffusion decoder, torch.compile 31.5 s cold; KV
    # 3.59M tokens (fp8_e4m3) at the stack's 0.85 (the seed's 78.4 GiB: some of the fraction goes
    # to activations, which the sim does not model apart). Starts: 2 min with the compile cached
    # (seed 003:90), so the weights take 2 min less the cached compile; a cold start is that plus
    # the 31.5 s compile, and seed 003's 3.5 min "including model download" leaves ~60 s for the
    # download of 18.9 GB at its link (the sim starts once the weights are here).
    Profile("diffusiongemma", ((0, 210.0), (32768, 185.0), (262144, 120.0)), _MOE_PREFILL,
            load_s=115.0, compile_s=31.5, weights_gib=18.9 * GB_IN_GIB, block=16, kv_tokens_per_gib=42_970),
)}


def auto_profile(model_name: str, speculative: dict) -> str:
    """The profile for a model (its config's `_name_or_path` or repo id) and speculative config,
    so the shipped stacks run unchanged on the sim image."""
    name = model_name.lower()
    if "diffusiongemma" in name:
        return "diffusiongemma"
    if "gemma-4" in name or "gemma4" in name:
        return "aeon-gemma4-v2" if speculative.get("method") == "dflash" else "aeon-gemma4-nospec"
    bf16 = "bf16" in name
    if speculative.get("method") == "dflash":
        tokens = speculative.get("num_speculative_tokens")
        if tokens == 1:
            return "qwen36-dflash-n1"
        if tokens == 7:  # seed 003's setup drafts 7 tokens; seed 000's DSpark pairing 8
            return "qwen36-dflash-v4"
        return "qwen36-bf16-dflash-n8" if bf16 else "qwen36-dflash-n8"
    return "qwen36-bf16" if bf16 else "qwen36-nvfp4"


def kv_capacity(profile: Profile, memory_fraction: float) -> int:
    """KV-cache tokens left once the weights are in, at this --gpu-memory-utilization."""
    return int(max(0.0, memory_fraction * _UNIFIED_GIB - profile.weights_gib) * profile.kv_tokens_per_gib)


def min_memory_fraction(profile: Profile) -> float:
    """The smallest --gpu-memory-utilization that holds the weights plus a little KV cache."""
    return min(1.0, (profile.weights_gib + 2.0) / _UNIFIED_GIB)
