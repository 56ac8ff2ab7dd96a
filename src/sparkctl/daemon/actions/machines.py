"""The machine a stack runs on, one protocol with two implementations: this Spark's Docker
machine (`Spark`: the parking and alias actions' own paths) and the fleet this daemon heads
(`fleet.machine.FleetMachine`). `Machines.of` chooses once per stack; the actions then ask the
chosen machine to switch an alias to the stack, park it, wake it, or say whether it is parked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sparkctl.messages import ParkDone, SwitchDone, WakeDone
from sparkctl.policy.parking import Park

if TYPE_CHECKING:
    from sparkctl.daemon.actions.aliases import Aliases
    from sparkctl.daemon.actions.parking import Parking
    from sparkctl.fleet.machine import FleetMachine
    from sparkctl.spec.models import Stack


class Machine(Protocol):
    local: bool  # whether its stacks hold this Spark's memory

    def switch(self, alias: str, spec: Stack) -> SwitchDone:
        """Point `alias` at `spec`'s stack (the caller holds the alias's turn)."""

    def park(self, stack: str, *, how: Park, ticket: int | None, still: Callable[[], bool]) -> ParkDone: ...

    def wake(self, stack: str, *, ticket: int | None) -> WakeDone: ...

    def parked(self, stack: str) -> bool: ...

    def serves(self, stack: str) -> bool:
        """Whether the stack is up or parked here, so the gateway may send it a request."""


@dataclass(frozen=True)
class Spark:
    """This Spark's Docker machine."""

    parking: Parking
    aliases: Aliases
    local = True

    def switch(self, alias: str, spec: Stack) -> SwitchDone:
        return self.aliases.switch_here(alias, spec)

    def park(self, stack: str, *, how: Park, ticket: int | None, still: Callable[[], bool]) -> ParkDone:
        return self.parking.park_here(stack, how=how, ticket=ticket, still=still)

    def wake(self, stack: str, *, ticket: int | None) -> WakeDone:
        return self.parking.wake_here(stack, ticket=ticket)

    def parked(self, stack: str) -> bool:
        return stack in self.parking.ctx.machine.desired().parked

    def serves(self, stack: str) -> bool:
        return stack in self.parking.ctx.machine.desired().stacks


@dataclass(frozen=True)
class Machines:
    spark: Spark
    fleet: FleetMachine | None = None  # on a fleet's head

    def of(self, stack: str) -> Machine:
        """The fleet's, for a stack placed across it (or whose file places it there), else this Spark's."""
        return self.fleet if self.fleet is not None and self.fleet.runs(stack) else self.spark
