"""Per-stack turns: actions on a key run one at a time in ticket order, a holder may re-enter,
and a skipped ticket does not block the ones behind it."""

from __future__ import annotations

import threading

from sparkctl.daemon.turns import Turns


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


def test_a_skipped_ticket_passes_its_turn_on() -> None:
    turns, done = Turns(), threading.Event()
    refused, next_one = turns.ticket("a"), turns.ticket("a")
    waiter = threading.Thread(target=lambda: turns.turn("a", next_one).__enter__() or done.set())
    waiter.start()
    # Time passing is the check here: while the refused ticket is neither used nor skipped, the one
    # behind it must not get its turn, however long it waits (there is no event for "still waiting").
    assert not done.wait(0.2)
    turns.skip("a", refused)
    assert done.wait(5)
    waiter.join(5)
