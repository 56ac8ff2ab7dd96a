"""Engine counters between two /metrics readings: speculative acceptance rate, mean acceptance
length and per-position acceptance (vLLM's spec_decode counters), committed tokens per denoising
step for diffusion engines, a histogram's quantile (TTFT p50); the KV-cache capacity an engine
reports. Pure, but for `read`, which asks an engine for its readings."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sparkctl.adapters import engine

SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(\{[^}]*\})? ([-+0-9.eE]+)$')
POSITION = re.compile(r'position="(\d+)"')
BOUND = re.compile(r'le="([^"]+)"')


@dataclass(frozen=True)
class EngineStats:
    acceptance: float | None = None  # accepted / drafted tokens
    acceptance_length: float | None = None  # tokens per verification step: 1 + accepted / drafts
    per_position: tuple[float, ...] = ()  # acceptance at draft position 0, 1, ...
    committed_per_step: float | None = None  # diffusion: tokens committed per denoising step


def parse(text: str) -> dict[str, float]:
    """Counters by name (labels folded), plus per-position samples as `name[i]`."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        name, labels, value = match[1], match[2] or "", float(match[3])
        values[name] = values.get(name, 0.0) + value
        if position := POSITION.search(labels):
            values[f"{name}[{position[1]}]"] = value
        if bound := BOUND.search(labels):  # a histogram's bucket: `name{le=0.5}`
            values[f"{name}{{le={bound[1]}}}"] = values.get(f"{name}{{le={bound[1]}}}", 0.0) + value
    return values


def read(url: str, headers: dict[str, str] | None = None) -> dict[str, float] | None:
    """An engine's /metrics readings (None: it did not answer within a second)."""
    try:
        return parse(engine.text(url, "/metrics", headers=headers or {}, timeout=1))
    except (OSError, ValueError):
        return None


def quantile(before: dict[str, float], after: dict[str, float], name: str, q: float) -> float | None:
    """The `q`-quantile of histogram `name` over the interval between two readings, from its
    buckets' growth, estimated as Prometheus' histogram_quantile does (linear within the bucket);
    None when nothing was observed in between."""
    prefix = f"{name}_bucket{{le="
    buckets = sorted((float(key[len(prefix):-1]), after[key] - before.get(key, 0.0))
                     for key in after if key.startswith(prefix))
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lower, below = q * buckets[-1][1], 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 0.0)
        lower, below = bound, count
    return lower


def between(before: dict[str, float], after: dict[str, float]) -> EngineStats:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    drafts, drafted = delta("vllm:spec_decode_num_drafts_total"), delta("vllm:spec_decode_num_draft_tokens_total")
    accepted, steps = delta("vllm:spec_decode_num_accepted_tokens_total"), delta("vllm:diffusion_num_denoising_steps")
    per_position = []
    while f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{len(per_position)}]" in after and drafts > 0:
        per_position.append(delta(f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{len(per_position)}]") / drafts)
    return EngineStats(
        acceptance=accepted / drafted if drafted > 0 else None,
        acceptance_length=1 + accepted / drafts if drafts > 0 else None,
        per_position=tuple(round(p, 4) for p in per_position),
        committed_per_step=delta("vllm:diffusion_num_committed_tokens") / steps if steps > 0 else None)


CACHE_INFO = re.compile(r'^vllm:cache_config_info\{([^}]*)\}', re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')
# vLLM V1's startup line: "GPU KV cache size: 322,368 tokens" (0.32 adds ", Maximum concurrency
# for 2,048 tokens per request: 1.23x" on the same line; its CPU build says "CPU KV cache size").
KV_LOG = re.compile(r'KV cache size: ([\d,]+) tokens')


def kv_tokens(text: str) -> int | None:
    """The engine's KV-cache capacity in tokens, from its /metrics text, its log, or both joined;
    the best source first. vLLM 0.24 and later put it in `vllm:cache_config_info`'s
    `kv_cache_size_tokens` label (0.20 has none); the startup log line gives the same figure;
    `num_gpu_blocks x block_size` of that metric comes last, since it is wrong for hybrid models
    (sliding-window or Mamba layers: a request holds blocks in several KV-cache groups)."""
    found = CACHE_INFO.search(text)
    labels = dict(LABEL.findall(found[1])) if found else {}
    if labels.get("kv_cache_size_tokens", "").isdigit():
        return int(labels["kv_cache_size_tokens"])
    if lines := KV_LOG.findall(text):
        return int(lines[-1].replace(",", ""))
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    if blocks.isdigit() and size.isdigit():
        return int(blocks) * int(size)
    return None
