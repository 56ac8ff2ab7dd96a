"""The seam between the daemon's loop and threads: the gateway's control methods a fleet thread
may call are the gateway's own, with the same parameters, run on the loop; and `blocking` runs
its call on a worker while the loop serves on."""

from __future__ import annotations

import asyncio
import inspect
import threading

from sparkctl.daemon.seam import GatewayFromThread, blocking
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable


def test_every_control_method_is_the_gateways_with_the_same_parameters() -> None:
    methods = {name for name, member in vars(GatewayFromThread).items()
               if callable(member) and not name.startswith("_")}
    assert methods == {"drain", "routes_changed", "eject_host", "eject_engine", "restore_engine", "restore_host"}
    for name in methods:
        wanted = [p for p in inspect.signature(getattr(GatewayFromThread, name)).parameters if p != "self"]
        theirs = inspect.signature(getattr(Gateway, name)).parameters
        assert [p for p in theirs if p != "self" and theirs[p].default is inspect.Parameter.empty] == wanted, name


def test_a_thread_drains_and_ejects_on_the_loop() -> None:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        gateway = asyncio.run_coroutine_threadsafe(_made(), loop).result(10)
        control = GatewayFromThread(gateway, loop)
        assert control.drain("a") is True  # a coroutine on the loop, awaited there
        control.eject_engine("http://127.0.0.1:1")
        control.restore_engine("http://127.0.0.1:1")
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()


def test_blocking_work_runs_on_a_worker_while_the_loop_serves() -> None:
    async def main() -> tuple[bool, int]:
        started, ticks = threading.Event(), 0
        release = threading.Event()

        def work() -> bool:
            started.set()
            return release.wait(5)

        call = asyncio.create_task(blocking(work))
        while not started.is_set() or ticks < 10:  # the loop goes on meanwhile
            ticks += 1
            await asyncio.sleep(0.001)
        release.set()
        return await call, ticks

    done, ticks = asyncio.run(main())
    assert done and ticks >= 10


async def _made() -> Gateway:
    return Gateway(lambda: RouteTable(upstreams={}), hold_queue=3, hold_timeout=5.0, drain_timeout=1.0)
