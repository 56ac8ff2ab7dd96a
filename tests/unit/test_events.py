"""The daemon's event bus: every deploy event names its stack (a stream shows only its own), a
coroutine waits for events without parking a thread, and a worker's events cross to the loop in
the order they were published."""

from __future__ import annotations


def test_every_deploy_event_names_its_stack() -> None:
    import asyncio

    from sparkctl.daemon.events import BusReporter, EventBus
    from sparkctl.phase import Phase

    bus = EventBus()
    reporter = BusReporter(bus)
    reporter.phase("a", Phase.PULLING)
    reporter.progress("b", "layer 1", 1, 10)
    reporter.note("a", "hello")
    assert [(e["kind"], e["stack"]) for e in asyncio.run(bus.wait_after(0, timeout=0))] == [
        ("phase", "a"), ("progress", "b"), ("note", "a")]


def test_a_coroutine_waits_for_events_without_a_thread() -> None:
    import asyncio
    import threading
    import time

    from sparkctl.daemon.events import EventBus
    from sparkctl.messages import Note

    async def run() -> tuple[list[dict], list[dict]]:
        bus = EventBus(asyncio.get_running_loop())
        threading.Timer(0.05, lambda: bus.publish(Note("a", "from another thread"))).start()
        began = time.monotonic()
        first = await bus.wait_after(0, timeout=5)
        assert time.monotonic() - began < 2  # woken by the event, not by the timeout
        worker = threading.Thread(target=lambda: [bus.publish(Note("a", str(i))) for i in range(100)])
        worker.start()
        worker.join()
        await asyncio.sleep(0)  # the worker's events, queued on the loop in order, land
        return first, await bus.wait_after(1, timeout=0.01)

    before = threading.active_count()
    first, then = asyncio.run(run())
    assert [e["text"] for e in first] == ["from another thread"]
    assert [e["text"] for e in then] == [str(i) for i in range(100)] and [e["seq"] for e in then] == list(range(2, 102))
    assert threading.active_count() <= before
