"""What a stack holds of unified memory in each state, and how deep to park it. Pure.

On a Spark the GPU and the CPU share one pool, so vLLM's sleep mode does not free what it moves:
- awake, a stack holds its `gpu_memory_utilization` fraction;
- parked at level 1 (`POST /sleep?level=1`), the weights' host backup: their size, in the same
  pool, plus the residue any sleeping engine keeps (its process, CUDA context and graphs);
- parked at level 2, the residue alone (weights and KV cache dropped; waking reloads the weights);
- the transient peaks: a level-1 sleep copies the weights once more before it frees them, and a
  level-1 wake can hold the backup while the KV cache is mapped again (vLLM #50011), so both
  count awake + weights. Level 2 never holds more than awake.

`choose` picks the deepest-keeping level whose peaks and result fit under the ceiling: level 1
(fastest wake), else level 2, else stop (a cold start later). All figures are fractions of the
machine's memory.

On GB10 a sleep is safe only in a narrow band (vLLM #50011): a level-1 wake that re-mapped a
37 GiB KV region worked, one that re-mapped 78 GiB killed the engine and twice froze the host, and
two sleep-enabled servers on one Spark took it down. `kv_budget` gives each engine an absolute KV
size (vLLM's --kv-cache-memory-bytes) instead of a fraction vLLM fills during start-up (vLLM
#46307), and `sleep_refusal` says why a stack must not sleep under those rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Park(StrEnum):
    """A stack's `switch.park` setting, and what a parked stack was parked with."""

    AUTO = "auto"
    SLEEP1 = "sleep1"
    SLEEP2 = "sleep2"
    STOP = "stop"

    @property
    def level(self) -> int:
        return {Park.SLEEP1: 1, Park.SLEEP2: 2}.get(self, 0)


@dataclass(frozen=True)
class Footprint:
    awake: float  # the gpu_memory_utilization fraction
    weights: float  # the weights' size as a fraction of memory (the level-1 backup)
    residue: float = 0.0  # what a sleeping engine keeps at either level

    def held(self, level: int) -> float:
        """What the stack holds parked at `level` (0: awake)."""
        return {0: self.awake, 1: self.weights + self.residue, 2: self.residue}[level]

    def peak(self, level: int) -> float:
        """The most it holds while going to or coming back from `level` (0: a cold start)."""
        return self.awake + self.weights if level == 1 else self.awake


@dataclass(frozen=True)
class Choice:
    park: Park  # SLEEP1, SLEEP2 or STOP
    why: str


def choose(setting: Park, stack: Footprint, *, beside: float, after: float, ceiling: float,
           unable: str | None = None) -> Choice:
    """How to park a running stack. `beside`: what everything else holds while it parks;
    `after`: what everything else will hold once it is parked (e.g. the next stack awake);
    `unable`: why this stack cannot sleep at all (its engine or its image), if so."""
    if unable:
        return Choice(Park.STOP, unable)
    wanted = [Park.SLEEP1, Park.SLEEP2] if setting is Park.AUTO else [setting]
    misses = []
    for park in [p for p in wanted if p is not Park.STOP]:
        level = park.level
        during, then = beside + stack.peak(level), after + stack.held(level)
        if during <= ceiling + 1e-9 and then <= ceiling + 1e-9:
            return Choice(park, f"{park}: parking peaks at {during:.2f} and leaves {then:.2f}, "
                                f"under the ceiling {ceiling:.2f}")
        misses.append(f"{park} would peak at {during:.2f} and leave {then:.2f}")
    if setting is Park.STOP:
        return Choice(Park.STOP, "stop: the stack's switch.park setting")
    return Choice(Park.STOP, f"stop: {'; '.join(misses)}, over the ceiling {ceiling:.2f}")


def kv_budget(fraction: float, *, usable: int, weights: int, overhead: int) -> int:
    """The KV cache an engine may hold, in bytes: its fraction of the usable memory, less its
    weights (target and draft) and the engine's own overhead (activations, CUDA graphs, context).
    Not positive: the weights leave no room at this fraction."""
    return int(fraction * usable) - weights - overhead


def sleep_refusal(stack: str, *, kv_bytes: int | None, kv_limit: int, sleeping: tuple[str, ...] = ()) -> str | None:
    """Why `stack` must park by stopping under GB10's sleep rules, if it must: its KV region is
    above the wake bound (or unknown: vLLM sized it), or another engine sleeps already (`sleeping`,
    none when the one-at-a-time rule is off)."""
    gib = 1 << 30
    if kv_bytes is None:
        return ("stop: its KV region is not bounded (the image's vLLM has no --kv-cache-memory-bytes), so a "
                "level-1 wake's re-map is unknown (vLLM #50011)")
    if kv_bytes > kv_limit:
        return (f"stop: a wake would re-map its {kv_bytes / gib:.1f} GiB KV region, over the safe bound "
                f"{kv_limit / gib:.1f} GiB (SPARKCTL_WAKE_KV_MAX_GIB; vLLM #50011 froze a Spark at 78 GiB)")
    others = [s for s in sleeping if s != stack]
    if others:
        return (f"stop: {others[0]} sleeps already, and on unified memory one engine sleeps at a time "
                "(SPARKCTL_SLEEP_ONE_AT_A_TIME; two sleeping servers took a Spark down, vLLM #50011)")
    return None
