"""The crossing from the daemon's worker threads onto the gateway's event loop: a switch (or the
fleet watch) on a worker thread holds, releases and drains the gateway's requests and moves its
replicas in and out of routing through `LoopControl`, which runs each call on the loop and waits
for its answer. The gateway itself is only ever touched on its loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from sparkctl.gateway.proxy import Gateway


class GatewayControl(Protocol):
    """What a switch on a worker thread asks of the gateway (`LoopControl` in the daemon, a
    recording fake in the switch's unit tests)."""

    def hold(self, alias: str, old: str | None, new: str) -> None: ...

    def release(self, alias: str) -> dict[str, float]: ...

    def drain(self, stack: str) -> bool: ...

    def routes_changed(self) -> None: ...

    def quiet_since(self, stack: str) -> float | None: ...


class LoopControl:
    """The gateway's hold, release and drain for a caller on another thread (the switch's)."""

    def __init__(self, gateway: Gateway, loop: asyncio.AbstractEventLoop, *, hold_queue: int, hold_timeout: float,
                 drain_timeout: float) -> None:
        self.gateway, self.loop = gateway, loop
        self.hold_queue, self.hold_timeout, self.drain_timeout = hold_queue, hold_timeout, drain_timeout

    def hold(self, alias: str, old: str | None, new: str) -> None:
        self._call(lambda: self.gateway.hold(alias, old, new, limit=self.hold_queue, timeout=self.hold_timeout))

    def release(self, alias: str) -> dict[str, float]:
        return self._call(lambda: self.gateway.release(alias))

    def drain(self, stack: str) -> bool:
        return asyncio.run_coroutine_threadsafe(self.gateway.drain(stack, self.drain_timeout), self.loop).result()

    def eject_host(self, address: str) -> None:
        self._call(lambda: self.gateway.eject_host(address))

    def eject_engine(self, url: str) -> None:
        self._call(lambda: self.gateway.eject_engine(url))

    def restore_engine(self, url: str) -> None:
        self._call(lambda: self.gateway.restore_engine(url))

    def restore_host(self, address: str) -> None:
        self._call(lambda: self.gateway.restore_host(address))

    def routes_changed(self) -> None:
        self._call(self.gateway.routes_changed)

    def quiet_since(self, stack: str) -> float | None:
        """When the stack's last request through the gateway finished (its ledger's, read on the loop)."""
        return self._call(lambda: self.gateway.ledger.quiet_since(stack))

    def _call(self, fn: Callable):
        async def on_loop():
            return fn()

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result()
