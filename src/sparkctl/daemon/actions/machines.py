"""The machine a stack runs on, one protocol with two implementations: this Spark's Docker
machine (`Spark`: the parking and alias actions' own paths) and the fleet this daemon heads
(`Fleet`: `fleet.machine.FleetMachine`, blocking, called on a worker in the stack's turn; also
`fleet up`, `down` and `ps`). `Machines.of` chooses once per stack (blocking: it reads the
stack files and the book); the actions then ask the chosen machine to switch an alias to the
stack, park it or wake it (coroutines on the loop, each taking the stack's turn itself), or say
whether it is parked or serves (blocking reads)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sparkctl.daemon.seam import blocking
from sparkctl.daemon.turns import Turns
from sparkctl.messages import FleetDownDone, FleetPs, FleetUpDone, ParkDone, SwitchDone, WakeDone
from sparkctl.policy.parking import Park

if TYPE_CHECKING:
    from sparkctl.daemon.actions.parking import Parking
    from sparkctl.daemon.actions.switch import Aliases
    from sparkctl.fleet.machine import FleetMachine
    from sparkctl.spec.models import Stack


class Machine(Protocol):
    local: bool  # whether its stacks hold this Spark's memory

    async def switch(self, alias: str, spec: Stack) -> SwitchDone:
        """Point `alias` at `spec`'s stack (the caller holds the alias's turn)."""

    async def park(self, stack: str, *, how: Park, ticket: int | None, still: Callable[[], bool]) -> ParkDone: ...

    async def wake(self, stack: str, *, ticket: int | None) -> WakeDone: ...

    def parked(self, stack: str) -> bool: ...

    def serves(self, stack: str) -> bool:
        """Whether the stack is up or parked here, so the gateway may send it a request."""


@dataclass(frozen=True)
class Spark:
    """This Spark's Docker machine."""

    parking: Parking
    aliases: Aliases
    local = True

    async def switch(self, alias: str, spec: Stack) -> SwitchDone:
        return await self.aliases.switch_here(alias, spec)

    async def park(self, stack: str, *, how: Park, ticket: int | None, still: Callable[[], bool]) -> ParkDone:
        return await self.parking.park_here(stack, how=how, ticket=ticket, still=still)

    async def wake(self, stack: str, *, ticket: int | None) -> WakeDone:
        return await self.parking.wake_here(stack, ticket=ticket)

    def parked(self, stack: str) -> bool:
        return stack in self.parking.desired.read().parked

    def serves(self, stack: str) -> bool:
        return stack in self.parking.desired.read().stacks


@dataclass(frozen=True)
class Fleet:
    """The fleet this daemon heads: each action in the stack's turn, its work on a worker."""

    machine: FleetMachine
    turns: Turns
    local = False

    async def up(self, stack: str, *, wait: float, ticket: int | None, say: Callable[[str], None]) -> FleetUpDone:
        async with self.turns.turn(stack, ticket):
            return await blocking(self.machine.up, stack, wait=wait, say=say)

    async def down(self, stack: str, *, wait: float, ticket: int | None) -> FleetDownDone:
        async with self.turns.turn(stack, ticket):
            return await blocking(self.machine.down, stack, wait=wait)

    async def ps(self, *, wait: float, book_only: bool) -> FleetPs:
        return await blocking(self.machine.ps, wait=wait, book_only=book_only)

    async def switch(self, alias: str, spec: Stack) -> SwitchDone:
        return await blocking(self.machine.switch, alias, spec)

    async def park(self, stack: str, *, how: Park, ticket: int | None, still: Callable[[], bool]) -> ParkDone:
        """Whatever `how` asks, its engines stop (sleep mode is not used across hosts)."""
        async with self.turns.turn(stack, ticket):
            if not still():
                return ParkDone(stack, "unchanged", f"{stack} is parked already or in use")
            return await blocking(self.machine.park, stack)

    async def wake(self, stack: str, *, ticket: int | None) -> WakeDone:
        async with self.turns.turn(stack, ticket):
            return await blocking(self.machine.wake, stack)

    def parked(self, stack: str) -> bool:
        return self.machine.parked(stack)

    def serves(self, stack: str) -> bool:
        return self.machine.serves(stack)

    def runs(self, stack: str) -> bool:
        return self.machine.runs(stack)


@dataclass
class Machines:
    """Built before the actions that ask it (`daemon/app.py`); `spark` is set once they exist,
    as this Spark's machine is made of their own paths."""

    fleet: Fleet | None  # on a fleet's head
    spark: Spark | None = None

    def of(self, stack: str) -> Machine:
        """The fleet's, for a stack placed across it (or whose file places it there), else this Spark's."""
        if self.fleet is not None and self.fleet.runs(stack):
            return self.fleet
        assert self.spark is not None, "Machines.spark is set as the daemon is built"
        return self.spark
