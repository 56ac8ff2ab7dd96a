"""The one seam between the daemon's event loop and threads. The daemon is asyncio: the API, the
actions, the switch and the reconciler are coroutines on one loop, which owns the sockets and
the gateway's state. Blocking work (the deploy pipeline, Docker SDK calls, blocking engine HTTP
calls, the store, desired.yaml) goes to a bounded pool of workers through `blocking`. Whatever
runs on a worker and must reach the loop crosses back here too: `to_loop` (in order, without
waiting: the pipeline's progress and notes on the event bus) and `GatewayFromThread` (the
gateway's control methods for the fleet watch's and fleet switch's own threads, waiting for the
answer). Nothing loop-owned is touched from a worker otherwise."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sparkctl.gateway.proxy import Gateway

T = TypeVar("T")

WORKERS = 32  # blocking calls at once: each deploy holds one for its length, a status read one briefly


def install(loop: asyncio.AbstractEventLoop) -> None:
    """The daemon's loop gets its bounded pool of workers (its start, before anything blocks)."""
    loop.set_default_executor(ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="blocking"))


async def blocking(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` on a worker; the loop serves on meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))


def to_loop(loop: asyncio.AbstractEventLoop | None, fn: Callable[..., object], *args: Any) -> None:
    """`fn(*args)` on `loop`: now when called there (or with no loop), else queued in call order."""
    with contextlib.suppress(RuntimeError):  # not on any loop
        if loop is None or asyncio.get_running_loop() is loop:
            fn(*args)
            return
    if loop is not None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(fn, *args)


class GatewayFromThread:
    """The gateway's control methods for a caller on its own thread (the fleet watch, the fleet
    switch): each runs on the gateway's loop, and the caller waits for its answer."""

    def __init__(self, gateway: Gateway, loop: asyncio.AbstractEventLoop) -> None:
        self.gateway, self.loop = gateway, loop

    def drain(self, stack: str) -> bool:
        return self._on_loop(self.gateway.drain(stack))

    def routes_changed(self) -> None:
        self._on_loop(_now(self.gateway.routes_changed))

    def eject_host(self, address: str) -> None:
        self._on_loop(_now(self.gateway.eject_host, address))

    def restore_host(self, address: str) -> None:
        self._on_loop(_now(self.gateway.restore_host, address))

    def eject_engine(self, url: str) -> None:
        self._on_loop(_now(self.gateway.eject_engine, url))

    def restore_engine(self, url: str) -> None:
        self._on_loop(_now(self.gateway.restore_engine, url))

    def _on_loop(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self.loop).result()


async def _now(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)
