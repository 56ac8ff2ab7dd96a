"""How to move an alias (`primary`, ...) from the stack it names to another. Pure.

Blue/green when the new stack fits in memory beside everything running: it starts while the old
one still serves, the alias flips, the old one drains and stops. Hold/swap when it fits only
once the old stack is gone: the gateway holds the alias's new requests while the old one drains
and stops and the new one starts. Anything else does not fit and is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from sparkctl.errors import SparkctlError
from sparkctl.policy.admission import admit


class Mode(StrEnum):
    BLUE_GREEN = "blue/green"
    HOLD_SWAP = "hold/swap"


@dataclass(frozen=True)
class SwitchPlan:
    alias: str
    old: str | None  # the stack the alias names now (None: a new alias)
    new: str
    mode: Mode
    stop_old: bool  # False when another alias still names the old stack
    why: str


def plan_switch(alias: str, new: str, *, fraction: float, aliases: Mapping[str, str],
                running: Mapping[str, float], ceiling: float) -> SwitchPlan:
    """`fraction`: the new stack's memory share; `running`: stack -> share, of running stacks."""
    old = aliases.get(alias)
    if old == new:
        raise SparkctlError(f"alias {alias} already names {new}")
    sharing = sorted(a for a, s in aliases.items() if s == old and a != alias) if old else []
    beside = admit(new, fraction, running, ceiling=ceiling)
    if beside.fits or old not in running:
        return SwitchPlan(alias, old, new, Mode.BLUE_GREEN, not sharing, beside.explain(new))
    instead = admit(new, fraction, {s: f for s, f in running.items() if s != old}, ceiling=ceiling)
    if not instead.fits:
        raise SparkctlError(f"{new} does not fit even once {old} stops: {instead.explain(new)}")
    if sharing:
        raise SparkctlError(f"{new} fits only once {old} stops, but {old} also serves alias "
                            f"{', '.join(sharing)}: switch that alias first, or free memory")
    return SwitchPlan(alias, old, new, Mode.HOLD_SWAP, True,
                      f"{new} needs the memory {old} holds ({beside.total:.2f} > {ceiling:.2f} together)")
