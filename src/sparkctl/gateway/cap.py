"""A stack's concurrency cap: how many of its requests the gateway forwards at once.

A stack's known issues can limit how many requests its engine takes at once
(`Upstream.max_concurrency`: only issues with a source, or `enforce: true`, count; the others
are advice `stacks show` prints); the `Gateway` keeps one cap per such stack and queues the excess
here, in arrival order, rather than forwarding it. Lives on the gateway's event loop.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Cap:
    """Slots taken at once while free, else waited for in order."""

    def __init__(self, size: int) -> None:
        self.free = size
        self.waiting: deque[asyncio.Future[None]] = deque()

    def take(self) -> bool:
        if self.free > 0:
            self.free -= 1
            return True
        return False

    async def wait(self) -> None:
        slot = asyncio.get_running_loop().create_future()
        self.waiting.append(slot)
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self.give()  # the slot was handed over as the waiter left: pass it on
            else:
                self.waiting.remove(slot)
            raise

    def give(self) -> None:
        """A slot comes free: to the first waiter, else back to the pool."""
        while self.waiting:
            slot = self.waiting.popleft()
            if not slot.done():
                slot.set_result(None)
                return
        self.free += 1
