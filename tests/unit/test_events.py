"""The daemon's event bus: every deploy event names its stack (a stream shows only its own), and
a coroutine waits for events without parking a thread."""

from __future__ import annotations


def test_every_deploy_event_names_its_stack() -> None:
    from sparkctl.daemon.events import BusReporter, EventBus
    from sparkctl.phase import Phase

    bus = EventBus()
    reporter = BusReporter(bus)
    reporter.phase("a", Phase.PULLING)
    reporter.progress("b", "layer 1", 1, 10)
    reporter.note("a", "hello")
    assert [(e["kind"], e["stack"]) for e in bus.after(0, timeout=0)] == [
        ("phase", "a"), ("progress", "b"), ("note", "a")]


def test_a_coroutine_waits_for_events_without_a_thread() -> None:
    import asyncio
    import threading

    from sparkctl.daemon.events import EventBus
    from sparkctl.messages import Note

    bus = EventBus()

    async def run() -> list[dict]:
        threading.Timer(0.05, lambda: bus.publish(Note("a", "from another thread"))).start()
        return await bus.wait_after(0, timeout=5)

    before = threading.active_count()
    assert [e["text"] for e in asyncio.run(run())] == ["from another thread"]
    assert threading.active_count() <= before
    assert asyncio.run(bus.wait_after(1, timeout=0.01)) == []
