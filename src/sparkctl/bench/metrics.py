"""Engine counters between two /metrics readings: speculative acceptance rate, mean acceptance
length and per-position acceptance (vLLM's spec_decode counters), and committed tokens per
denoising step for diffusion engines; the KV-cache capacity an engine reports. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass

SAMPLE = re.compile(r'^([a-zA-Z_:][\w:]*)(\{[^}]*\})? ([-+0-9.eE]+)$')
POSITION = re.compile(r'position="(\d+)"')


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
    return values


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
