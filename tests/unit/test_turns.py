"""Per-stack turns: actions on a key run one at a time in ticket order, other keys never wait,
and a withdrawn ticket (a refused request, a cancelled action) leaves the queue: it never runs,
and neither blocks the ones behind it nor touches any other."""

from __future__ import annotations

import asyncio

import pytest

from sparkctl.daemon.turns import Turns, Withdrawn


async def _settle() -> None:
    """Every task that can move, moves (the loop runs them until they wait again)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_turns_run_in_ticket_order_not_task_start_order() -> None:
    async def main() -> tuple[list[int], list[int]]:
        turns, ran = Turns(), []
        tickets = [turns.ticket("a") for _ in range(4)]

        async def act(ticket: int) -> None:
            async with turns.turn("a", ticket):
                ran.append(ticket)
                await asyncio.sleep(0)  # holds its turn across a wait

        await asyncio.gather(*(act(t) for t in reversed(tickets)))  # started last-first
        return ran, tickets

    ran, tickets = asyncio.run(main())
    assert ran == tickets


def test_other_keys_do_not_wait() -> None:
    async def main() -> list[str]:
        turns, order, release = Turns(), [], asyncio.Event()

        async def hold_a() -> None:
            async with turns.turn("a"):
                await release.wait()
                order.append("a")

        async def take_b() -> None:
            async with turns.turn("b"):
                order.append("b")
            release.set()

        await asyncio.gather(hold_a(), take_b())
        return order

    assert asyncio.run(main()) == ["b", "a"]


def test_a_withdrawn_ticket_passes_its_turn_on() -> None:
    async def main() -> None:
        turns = Turns()
        refused, next_one = turns.ticket("a"), turns.ticket("a")
        got = asyncio.Event()

        async def wait_turn() -> None:
            async with turns.turn("a", next_one):
                got.set()

        waiter = asyncio.create_task(wait_turn())
        await _settle()
        assert not got.is_set()  # the refused ticket is neither used nor withdrawn: the next one waits
        assert turns.withdraw("a", refused)
        await asyncio.wait_for(waiter, 5)
        with pytest.raises(Withdrawn):  # its action, come late, does not run
            async with turns.turn("a", refused):
                pass

    asyncio.run(main())


def test_a_cancelled_waiting_ticket_leaves_the_queue_and_touches_no_other() -> None:
    """The audit's case: A holds the stack's turn (its `up` fetching), B and C wait behind it.
    Withdrawing B wakes B's waiter at once with `Withdrawn` (it never runs), leaves A's turn alone
    (and A's own ticket cannot be withdrawn: it runs), and C runs once A is done."""
    async def main() -> None:
        turns, ran, outcome, release = Turns(), [], {}, asyncio.Event()
        a, b, c = (turns.ticket("stack") for _ in range(3))

        async def act(name: str, ticket: int) -> None:
            try:
                async with turns.turn("stack", ticket):
                    ran.append(name)
                    if name == "a":
                        await release.wait()
                outcome[name] = "ran"
            except Withdrawn as e:
                outcome[name] = str(e)

        tasks = {name: asyncio.create_task(act(name, t)) for name, t in (("a", a), ("b", b), ("c", c))}
        await _settle()
        assert not turns.withdraw("stack", a)  # its turn is taken: it runs
        assert turns.withdraw("stack", b)
        assert not turns.withdraw("stack", b)  # once
        await asyncio.wait_for(tasks["b"], 5)
        assert outcome == {"b": "cancelled before its turn: it did not run"} and ran == ["a"]  # A untouched
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks.values()), 5)
        assert ran == ["a", "c"] and outcome == {"a": "ran", "b": "cancelled before its turn: it did not run",
                                                 "c": "ran"}
        assert not turns.withdraw("stack", c)  # over

    asyncio.run(main())


def test_a_ticket_whose_turn_came_but_was_not_taken_yet_can_still_leave() -> None:
    async def main() -> None:
        turns = Turns()
        first, second = turns.ticket("a"), turns.ticket("a")
        assert turns.withdraw("a", first)  # its action has not asked yet
        async with turns.turn("a", second):  # the next one goes at once
            pass
        with pytest.raises(Withdrawn):
            async with turns.turn("a", first):
                pass

    asyncio.run(main())


def test_a_waiter_cancelled_before_its_turn_leaves_the_queue() -> None:
    """A task cancelled while it waits (its request's task ended) must not hold up the ones behind it."""
    async def main() -> None:
        turns = Turns()
        first, second, third = (turns.ticket("a") for _ in range(3))
        async with turns.turn("a", first):
            async def wait(ticket: int) -> None:
                async with turns.turn("a", ticket):
                    pass

            cancelled, behind = asyncio.create_task(wait(second)), asyncio.create_task(wait(third))
            await _settle()
            cancelled.cancel()
            await _settle()
        await asyncio.wait_for(behind, 5)

    asyncio.run(main())
