"""The bridge between the daemon's worker threads and the gateway's loop: every control method a
switch may call is one of the gateway's, called with the same arguments, and nothing else of the
gateway can be reached from a thread through it."""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest

from sparkctl.daemon.bridge import CONTROL, GatewayControl, LoopControl
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable


def test_every_control_method_is_the_gateways_with_the_same_parameters() -> None:
    assert CONTROL == {"hold", "release", "drain", "routes_changed", "quiet_since", "eject_host", "eject_engine",
                       "restore_engine", "restore_host"}
    for name in CONTROL:
        wanted = [p for p in inspect.signature(getattr(GatewayControl, name)).parameters if p != "self"]
        theirs = inspect.signature(getattr(Gateway, name)).parameters
        assert [p for p in theirs if p != "self" and theirs[p].default is inspect.Parameter.empty] == wanted, name


def test_a_thread_holds_releases_and_drains_on_the_loop_and_nothing_else() -> None:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        gateway = asyncio.run_coroutine_threadsafe(_made(), loop).result(10)
        control = LoopControl(gateway, loop)
        control.hold("primary", "a", "b")
        assert gateway.holds["primary"].limit == 3  # the gateway's own hold settings
        assert control.release("primary")["held_requests"] == 0
        assert control.drain("a") is True  # a coroutine on the loop, awaited there
        assert control.quiet_since("a") == 0.0  # never asked: quiet since the start
        with pytest.raises(AttributeError, match="not one of the gateway's control methods"):
            control.close  # noqa: B018 - reaching it is the refusal
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()


async def _made() -> Gateway:
    return Gateway(lambda: RouteTable(upstreams={}), hold_queue=3, hold_timeout=5.0, drain_timeout=1.0)
