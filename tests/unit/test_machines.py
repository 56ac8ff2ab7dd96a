"""Each stack's machine, chosen once (`Machines.of`): the fleet's for a stack placed across it or
whose file places it there, this Spark's for every other stack, and always this Spark's on a
daemon that heads no fleet. The actions ask the chosen machine; none of them branches on the fleet."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from sparkctl.adapters.placements import PlacementFile
from sparkctl.daemon.actions.machines import Fleet, Machines
from sparkctl.daemon.turns import Turns
from sparkctl.fleet.deploy import FleetUp, Fleetwide
from sparkctl.fleet.machine import FleetMachine
from sparkctl.fleet.placement import Book, Placed, Replica
from sparkctl.settings import Settings


def spec(fleet: bool = False, parallel: object = None) -> SimpleNamespace:
    return SimpleNamespace(placement=SimpleNamespace(fleet=fleet), parallel=parallel)


def test_each_stack_is_run_by_the_machine_its_placement_names(tmp_path: Path) -> None:
    book = Book(PlacementFile(tmp_path))
    book.change(lambda entries: entries.update(placed=Placed("placed", "stack-placed", (Replica("b", "u", "f"),),
                                                             "spec", {})))
    catalog = SimpleNamespace(stacks={"placed": spec(), "spread": spec(fleet=True), "group": spec(parallel=2),
                                      "here": spec()})
    fleetwide = Fleetwide(backend=None, settings=Settings(state_dir=tmp_path), fleet=None, head="h", book=book)
    fleet = Fleet(FleetMachine(fleetwide=fleetwide, catalog=lambda: catalog, desired=None, routes=None, store=None,
                               gateway=None, total_bytes=1, wait=1), Turns())
    spark = SimpleNamespace(local=True)
    machines = Machines(fleet, spark)
    assert {name: machines.of(name) for name in ("placed", "spread", "group", "here", "unknown")} == {
        "placed": fleet, "spread": fleet, "group": fleet, "here": spark, "unknown": spark}
    assert fleet.serves("placed") and not fleet.serves("spread")  # placed (up or parked), or not yet
    assert Machines(None, spark).of("placed") is spark  # a daemon that heads no fleet


def test_fleet_up_and_down_use_the_turn_their_request_took(tmp_path: Path) -> None:
    """The API takes a ticket for the stack's turn as a `fleet up` or `down` arrives; the fleet's
    machine runs in that turn, so the park that follows is not left waiting for it for ever."""
    turns = Turns()
    placed = Placed("duo", "stack-duo", (Replica("b", "u", "f"),), "spec", {})
    fleetwide = SimpleNamespace(up=lambda spec, **kw: FleetUp(placed, {}, []), down=lambda stack, wait: [])
    fleet = Fleet(FleetMachine(fleetwide=fleetwide, catalog=lambda: SimpleNamespace(stack=lambda name: spec()),
                               desired=None, routes=SimpleNamespace(refresh=lambda: None), store=None, gateway=None,
                               total_bytes=1, wait=1), turns)
    done: list = []

    async def requests() -> None:  # as the API runs them: each with the ticket its request took
        done.append((await fleet.up("duo", wait=0, ticket=turns.ticket("duo"), say=print)).replicas[0].host)
        done.append((await fleet.down("duo", wait=1, ticket=turns.ticket("duo"))).removed)
        async with turns.turn("duo", turns.ticket("duo")):  # the park that follows
            done.append("parked")

    asyncio.run(asyncio.wait_for(requests(), 5))
    assert done == ["b", {}, "parked"]  # none waited for a turn that never came
