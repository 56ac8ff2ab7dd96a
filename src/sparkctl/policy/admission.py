"""Memory admission: may a stack start beside the ones already running?

vLLM reserves `gpu_memory_utilization` of unified memory up front, so co-resident stacks must
keep the sum of their fractions under the ceiling (settings.memory_ceiling). Pure; the deploy
pipeline and the switch planner ask it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Admission:
    fits: bool
    total: float  # the sum of fractions if the stack starts beside the others
    ceiling: float
    in_the_way: tuple[str, ...] = ()  # running stacks to stop, largest first, to make room

    def explain(self, stack: str) -> str:
        if self.fits:
            return f"{stack} fits: {self.total:.2f} of unified memory <= ceiling {self.ceiling:.2f}"
        return (f"{stack} does not fit: with the running stacks it would reserve {self.total:.2f} of unified "
                f"memory, over the ceiling {self.ceiling:.2f}; stop {', '.join(self.in_the_way)} "
                "(or pass --replace to stop them first)")


def admit(stack: str, fraction: float, running: Mapping[str, float], *, ceiling: float) -> Admission:
    """Whether `stack` (reserving `fraction`) fits beside `running` (name -> fraction)."""
    others = {name: f for name, f in running.items() if name != stack}
    total = fraction + sum(others.values())
    if total <= ceiling + 1e-9:
        return Admission(True, total, ceiling)
    in_the_way: list[str] = []
    freed = 0.0
    for name, f in sorted(others.items(), key=lambda item: (-item[1], item[0])):
        in_the_way.append(name)
        freed += f
        if total - freed <= ceiling + 1e-9:
            break
    return Admission(False, total, ceiling, tuple(in_the_way))
