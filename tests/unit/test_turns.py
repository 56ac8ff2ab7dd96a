"""Per-stack turns: actions on a key run one at a time in ticket order, a holder may re-enter,
and a withdrawn ticket (a refused request, a cancelled action) leaves the queue: it never runs,
and neither blocks the ones behind it nor touches any other."""

from __future__ import annotations

import threading

import pytest

from sparkctl.daemon.turns import Turns, Withdrawn


def test_turns_run_in_ticket_order_not_thread_start_order() -> None:
    turns, ran = Turns(), []
    tickets = [turns.ticket("a") for _ in range(4)]

    def act(ticket: int) -> None:
        with turns.turn("a", ticket):
            ran.append(ticket)

    threads = [threading.Thread(target=act, args=(t,)) for t in reversed(tickets)]  # started last-first
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert ran == tickets


def test_a_holder_re_enters_and_other_keys_do_not_wait() -> None:
    turns, order = Turns(), []
    with turns.turn("a"), turns.turn("a"):  # the deploy inside an `up` takes its stack's turn again
        other = threading.Thread(target=lambda: turns.turn("b").__enter__() or order.append("b"))
        other.start()
        other.join(5)
        order.append("a")
    assert order == ["b", "a"]


def test_a_withdrawn_ticket_passes_its_turn_on() -> None:
    turns, done = Turns(), threading.Event()
    refused, next_one = turns.ticket("a"), turns.ticket("a")
    waiter = threading.Thread(target=lambda: turns.turn("a", next_one).__enter__() or done.set())
    waiter.start()
    # Time passing is the check here: while the refused ticket is neither used nor withdrawn, the
    # one behind it must not get its turn, however long it waits (there is no event for "still waiting").
    assert not done.wait(0.2)
    assert turns.withdraw("a", refused)
    assert done.wait(5)
    waiter.join(5)
    with pytest.raises(Withdrawn):  # its worker, come late, does not run
        turns.turn("a", refused).__enter__()


def test_a_cancelled_waiting_ticket_leaves_the_queue_and_touches_no_other() -> None:
    """The audit's case: A holds the stack's turn (its `up` fetching), B and C wait behind it.
    Withdrawing B wakes B's waiter at once with `Withdrawn` (it never runs), leaves A's turn alone
    (and A's own ticket cannot be withdrawn: it runs), and C runs once A is done."""
    turns, ran, outcome = Turns(), [], {}
    a, b, c = (turns.ticket("stack") for _ in range(3))
    release = threading.Event()

    def act(name: str, ticket: int) -> None:
        try:
            with turns.turn("stack", ticket):
                ran.append(name)
                if name == "a":
                    release.wait(5)
            outcome[name] = "ran"
        except Withdrawn as e:
            outcome[name] = str(e)

    threads = {name: threading.Thread(target=act, args=(name, t)) for name, t in (("a", a), ("b", b), ("c", c))}
    for thread in threads.values():
        thread.start()
    assert not turns.withdraw("stack", a)  # its turn is taken: it runs
    assert turns.withdraw("stack", b)
    assert not turns.withdraw("stack", b)  # once
    threads["b"].join(5)
    assert outcome == {"b": "cancelled before its turn: it did not run"} and ran == ["a"]  # A untouched, still on
    release.set()
    for thread in threads.values():
        thread.join(5)
    assert ran == ["a", "c"] and outcome == {"a": "ran", "b": "cancelled before its turn: it did not run", "c": "ran"}
    assert not turns.withdraw("stack", c)  # over


def test_a_ticket_whose_turn_came_but_was_not_taken_yet_can_still_leave() -> None:
    turns = Turns()
    first, second = turns.ticket("a"), turns.ticket("a")
    assert turns.withdraw("a", first)  # its worker thread has not asked yet
    with turns.turn("a", second):  # the next one goes at once
        pass
    with pytest.raises(Withdrawn):
        turns.turn("a", first).__enter__()
