"""What the seeds computed by hand, computed: the speedup of a speculative config over its
no-spec twin per depth, the crossover depth past which speculation is slower, decode
efficiency against the memory-bandwidth bound, and which checkpoint (NVFP4, BF16...) of which
model a config serves, so the headline can set engines and quantisations side by side. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

# Precision and quantisation markers as model repos spell them in their names (`...-NVFP4`).
CHECKPOINTS = ("NVFP4", "MXFP4", "FP4", "FP8", "BF16", "FP16", "FP32", "INT4", "INT8", "W4A16", "W8A8", "AWQ", "GPTQ",
               "GGUF")


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
    engine: str = ""  # the image ref as run (repo:tag): one engine build
    speculation: str = ""  # e.g. "dflash n=8"; empty without speculation
    checkpoint: str = ""  # NVFP4, BF16...: `checkpoint_of` the model, else the stack's quantization

    @property
    def family(self) -> str:
        """The model without its checkpoint marker: the NVFP4 and BF16 builds of one model share it."""
        return family_of(self.model)


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


def checkpoint_of(model: str) -> str:
    """The precision named in a model's name (NVFP4, BF16...), or "" when it names none."""
    found = [t.upper() for t in _tokens(model) if t.upper() in CHECKPOINTS]
    return found[-1] if found else ""


def family_of(model: str) -> str:
    head, _, name = model.rpartition("/")
    kept = "".join(part for part in re.split(r"([-_.])", name) if part.upper() not in CHECKPOINTS)
    kept = re.sub(r"([-_.])[-_.]+", r"\1", kept).strip("-_.")
    return f"{head}/{kept}" if head else kept


def _tokens(model: str) -> list[str]:
    return re.split(r"[-_.]", model.rpartition("/")[2])
