"""The crossing from the daemon's worker threads onto the gateway's event loop: a switch (or the
fleet watch) on a worker thread holds, releases and drains the gateway's requests and moves its
replicas in and out of routing through `LoopControl`, which runs each call on the loop and waits
for its answer. The gateway itself is only ever touched on its loop."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, Protocol

from sparkctl.gateway.proxy import Gateway


class GatewayControl(Protocol):
    """What a switch, a park or the fleet watch on a worker thread asks of the gateway: these
    methods of `Gateway`, through `LoopControl` (a recording fake in the unit tests)."""

    def hold(self, alias: str, old: str | None, new: str) -> None: ...

    def release(self, alias: str) -> dict[str, float]: ...

    def drain(self, stack: str) -> bool: ...

    def routes_changed(self) -> None: ...

    def quiet_since(self, stack: str) -> float | None: ...

    def eject_host(self, address: str) -> None: ...

    def eject_engine(self, url: str) -> None: ...

    def restore_engine(self, url: str) -> None: ...

    def restore_host(self, address: str) -> None: ...


CONTROL = frozenset(name for name, member in vars(GatewayControl).items()
                    if callable(member) and not name.startswith("_"))


class LoopControl:
    """`GatewayControl` for a caller on another thread: each of the gateway's control methods runs
    on the gateway's loop (awaited there when it is a coroutine), and the caller waits for its answer."""

    def __init__(self, gateway: Gateway, loop: asyncio.AbstractEventLoop) -> None:
        self.gateway, self.loop = gateway, loop

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in CONTROL:
            raise AttributeError(f"{name} is not one of the gateway's control methods ({', '.join(sorted(CONTROL))})")
        method = getattr(self.gateway, name)

        def on_loop(*args: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(_answer(method, args), self.loop).result()

        return on_loop


async def _answer(method: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    answer = method(*args)
    return await answer if inspect.isawaitable(answer) else answer
