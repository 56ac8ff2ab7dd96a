"""Benchmark profiles: what llama-benchy runs. Named in stack specs (`bench_profile`) and on
the CLI. `quick` runs at switch-over; `seed` is seed 000's methodology; `sampled` is the same at
T=1.0 (seed 000:51: the draft's acceptance gains are larger under T=1.0 sampling than under
llama-benchy's near-greedy default); `concurrency` finds engines that fall over under parallel
load; `cached` measures the time to first token of a prompt whose context the engine's prefix cache
holds (llama-benchy's prefix mode: each test sends its context first, then a prompt after it),
which seed 000 could not (prefix caching hung with its draft)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sparkctl.errors import SparkctlError


@dataclass(frozen=True)
class Profile:
    name: str
    pp: int
    tg: int
    depths: tuple[int, ...]
    runs: int
    concurrency: tuple[int, ...] = (1,)
    temperature: float | None = None  # None: the engine's default (llama-benchy sends none)
    prefix_cached: bool = False  # llama-benchy's --enable-prefix-caching: a cold and a cached TTFT per depth

    def within(self, max_model_len: int | None) -> Profile:
        """The profile without the depths whose requests would not fit the context window."""
        if max_model_len is None:
            return self
        kept = tuple(d for d in self.depths if d + self.pp + self.tg <= max_model_len)
        return replace(self, depths=kept or self.depths[:1])

    def tests(self) -> list[tuple[int, int]]:
        """(depth, concurrency) in the order llama-benchy runs them."""
        return [(d, c) for d in self.depths for c in self.concurrency]

    def args(self) -> list[str]:
        sampling = [] if self.temperature is None else ["--extra-body", f"temperature={float(self.temperature)!r}"]
        return ["--pp", str(self.pp), "--tg", str(self.tg), "--depth", *map(str, self.depths),
                "--runs", str(self.runs), "--concurrency", *map(str, self.concurrency), "--exact-tg",
                "--latency-mode", "generation", *sampling, *(["--enable-prefix-caching"] if self.prefix_cached else [])]


SEED_DEPTHS = (0, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152, 65536)
PROFILES = {
    "quick": Profile("quick", 512, 128, (0, 4096, 16384), runs=1),
    "seed": Profile("seed", 512, 256, SEED_DEPTHS, runs=2),
    "sampled": Profile("sampled", 512, 256, SEED_DEPTHS, runs=2, temperature=1.0),
    "concurrency": Profile("concurrency", 512, 128, (0,), runs=1, concurrency=(1, 4, 16, 32, 64)),
    "cached": Profile("cached", 512, 128, (4096, 16384, 65536), runs=2, prefix_cached=True),
}


QUALITY = "quality"  # `bench run -p quality`: not llama-benchy's, the quality gate's measurement (`quality.py`)

def choose(name: str, *, depths: str = "", runs: int | None = None, temperature: float | None = None) -> Profile:
    """The profile `name`, its depths (`0,4096,8192`), runs per depth and temperature replaced where given."""
    if name not in PROFILES:
        raise SparkctlError(f"no benchmark profile {name!r}; choose one of {', '.join(PROFILES)} (or {QUALITY}: "
                            "the quality gate's accuracy, with lm-eval)")
    chosen = PROFILES[name]
    if depths:
        try:
            chosen = replace(chosen, depths=tuple(int(d) for d in depths.split(",")))
        except ValueError:
            raise SparkctlError(f"--depths takes comma-separated token counts, got {depths!r}") from None
    if temperature is not None:
        chosen = replace(chosen, temperature=temperature)
    return replace(chosen, runs=runs) if runs else chosen
