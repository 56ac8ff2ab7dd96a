"""What the seeds computed by hand, computed: the speedup of a speculative config over its
no-spec twin per depth, the crossover depth past which speculation is slower, and decode
efficiency against the memory-bandwidth bound. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """One benchmarked config, as the report sees it."""

    name: str
    model: str  # the model repo (or path): twins share it
    image: str  # the image repository
    extends: str | None
    speculative: bool
    read_per_token_gb: float | None
    decode: Mapping[int, float]  # depth -> decode tok/s, single stream


def twin(config: Config, others: list[Config]) -> Config | None:
    """The no-spec config a speculative one is measured against: the one it extends if that is
    plain, else the plain config of the same model, preferring the same image."""
    if not config.speculative:
        return None
    plain = [o for o in others if not o.speculative and o.model == config.model and o.name != config.name]
    return next((o for o in plain if o.name == config.extends), None) or \
        next((o for o in plain if o.image == config.image), None) or (plain[0] if plain else None)


def speedups(config: Config, base: Config) -> dict[int, float]:
    """Per depth both measured: spec decode / no-spec decode."""
    return {d: config.decode[d] / base.decode[d] for d in sorted(config.decode)
            if d in base.decode and base.decode[d] > 0}


def crossover(speedup: Mapping[int, float]) -> tuple[int, int] | None:
    """(last depth still faster, first depth slower) where speculation turns slower for good."""
    depths = sorted(speedup)
    for before, after in zip(depths, depths[1:], strict=False):
        if speedup[before] >= 1 > speedup[after] and all(speedup[d] < 1 for d in depths if d > after):
            return before, after
    return None


def efficiency(decode_tps: float, read_per_token_gb: float | None, bandwidth_gbs: float) -> float | None:
    """Decode as a fraction of the bandwidth bound (bandwidth / bytes read per token)."""
    if not read_per_token_gb:
        return None
    return decode_tps * read_per_token_gb / bandwidth_gbs
