"""How to move an alias (`primary`, ...) from the stack it names to another. Pure; the daemon's
`switch.py` runs the plan.

Blue/green when the new stack fits in memory beside everything running; hold/swap when it fits
only once the old stack has made room. Anything else does not fit and is refused with the reason.
The old stack leaves by parking (vLLM sleep mode, `policy/parking.py`) where its setting, its
engine and the memory allow, else by stopping. A parked new stack wakes instead of starting
cold; its wake peak is what must fit. When it fits only without what other parked stacks hold,
they are stopped first (largest first, as few as needed): they stay desired, parked stopped,
and start cold when next asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sparkctl.errors import SparkctlError
from sparkctl.policy.parking import Choice, Footprint, Park, choose


class Mode(StrEnum):
    BLUE_GREEN = "blue/green"
    HOLD_SWAP = "hold/swap"


@dataclass(frozen=True)
class Memory:
    """The machine's memory as the planner sees it: fractions held now, by running and parked
    stacks, and the ceiling they must stay under."""

    held: Mapping[str, float]
    ceiling: float
    parked: Mapping[str, int] = field(default_factory=dict)  # stack -> the level it sleeps at

    def beside(self, *stacks: str | None) -> float:
        """What every stack but these holds."""
        return sum(f for s, f in self.held.items() if s not in stacks)


@dataclass(frozen=True)
class Leaving:
    """How the old stack may leave: its `switch.park`, its footprint, and why it cannot sleep."""

    setting: Park = Park.STOP
    footprint: Footprint = Footprint(0.0, 0.0)
    unable: str | None = None


@dataclass(frozen=True)
class SwitchPlan:
    alias: str
    old: str | None  # the stack the alias names now (None: a new alias)
    new: str
    mode: Mode
    stop_old: bool  # False when another alias still names the old stack
    why: str
    park: Park = Park.STOP  # how the old stack leaves: parked at a level, or stopped
    wake: int = 0  # the level the new stack sleeps at (0: it is awake or absent)
    evict: tuple[str, ...] = ()  # other parked stacks stopped first to make room


class DoesNotFit(SparkctlError):
    """The new stack does not fit in memory in any mode."""


def plan_switch(alias: str, new: str, *, footprint: Footprint, aliases: Mapping[str, str], memory: Memory,
                leaving: Leaving = Leaving()) -> SwitchPlan:
    """`footprint`: the new stack's; `memory`: what runs and sleeps now."""
    try:
        return _plan(alias, new, footprint=footprint, aliases=aliases, memory=memory, leaving=leaving)
    except DoesNotFit:
        old = aliases.get(alias)
        sleeping = sorted((s for s in memory.parked if s not in (old, new) and memory.held.get(s, 0.0) > 0),
                          key=lambda s: -memory.held[s])
        for n in range(1, len(sleeping) + 1):
            evict = tuple(sleeping[:n])
            lighter = replace(memory, held={s: f for s, f in memory.held.items() if s not in evict})
            try:
                plan = _plan(alias, new, footprint=footprint, aliases=aliases, memory=lighter, leaving=leaving)
            except DoesNotFit:
                continue
            return replace(plan, evict=evict, why=f"{plan.why}; parked {', '.join(evict)} stopped first to make room")
        raise


def _plan(alias: str, new: str, *, footprint: Footprint, aliases: Mapping[str, str], memory: Memory,
          leaving: Leaving) -> SwitchPlan:
    old = aliases.get(alias)
    if old == new:
        raise SparkctlError(f"alias {alias} already names {new}")
    sharing = sorted(a for a, s in aliases.items() if s == old and a != alias) if old else []
    wake, ceiling = memory.parked.get(new, 0), memory.ceiling
    others, peak = memory.beside(old, new), footprint.peak(wake)
    coming = f"{new} {'wakes from level ' + str(wake) if wake else 'starts'} (peak {peak:.2f})"
    old_awake = old in memory.held and old not in memory.parked
    together = others + memory.held.get(old, 0.0) + peak  # type: ignore[arg-type]
    if together > ceiling + 1e-9 and not old_awake:  # nothing awake to make room
        raise DoesNotFit(f"{new} does not fit: {coming} beside {together - peak:.2f} held by the other stacks, "
                            f"over the ceiling {ceiling:.2f}; park or stop another stack first")
    if together <= ceiling + 1e-9:
        plan = SwitchPlan(alias, old, new, Mode.BLUE_GREEN, not sharing, f"{coming} beside the rest: "
                          f"{together:.2f} of memory <= ceiling {ceiling:.2f}", wake=wake)
        if old and old in memory.parked:  # it sleeps already: it stays as it is
            return _with(plan, Choice(Park(f"sleep{memory.parked[old]}"), f"{old} stays parked"))
        if not (old_awake and plan.stop_old):
            return plan
        after = others + footprint.awake
        return _with(plan, choose(leaving.setting, leaving.footprint, beside=after, after=after, ceiling=ceiling,
                                  unable=leaving.unable))
    if others + peak > ceiling + 1e-9:
        raise DoesNotFit(f"{new} does not fit even once {old} stops: {coming} beside {others:.2f} held by the "
                            f"other stacks, over the ceiling {ceiling:.2f}")
    if sharing:
        raise SparkctlError(f"{new} fits only once {old} stops, but {old} also serves alias "
                            f"{', '.join(sharing)}: switch that alias first, or free memory")
    plan = SwitchPlan(alias, old, new, Mode.HOLD_SWAP, True, f"{coming} needs the memory {old} holds "
                      f"({together:.2f} > {ceiling:.2f} together)", wake=wake)
    return _with(plan, choose(leaving.setting, leaving.footprint, beside=others + memory.held.get(new, 0.0),
                              after=others + peak, ceiling=ceiling, unable=leaving.unable))


def _with(plan: SwitchPlan, choice: Choice) -> SwitchPlan:
    return replace(plan, why=f"{plan.why}; {plan.old} leaves by {choice.why}", park=choice.park)
