"""A hold on one alias while its stack is swapped (or on a parked stack's name while it wakes, or
on a stack while none of its replicas is in routing): new requests wait in a bounded queue and are
let go in arrival order once the name points at a serving stack again. A request held past the
timeout, one that finds the queue full, or all of them when the wake failed, are refused so the
client can retry. Lives on the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Hold:
    alias: str
    old: str | None
    new: str
    limit: int
    timeout: float
    since: float = field(default_factory=time.monotonic)
    waiting: deque[asyncio.Future[None]] = field(default_factory=deque)
    refused: int = 0
    failure: str | None = None  # why the hold ended without a serving stack
    done: bool = False  # released or failed: a late arrival does not wait
    waiting_for: str = ""  # what the requests wait for, when not a switch ("a replica of X to come back")
    code: str = "switch_in_progress"  # the error code of a refusal

    async def wait(self) -> str | None:
        """Wait for the release; None once released, else why the request is refused."""
        if self.done:
            return self.failure
        if len(self.waiting) >= self.limit:
            self.refused += 1
            what = self.waiting_for or f"the switch of {self.alias}"
            return f"{len(self.waiting)} requests are already waiting for {what}"
        released = asyncio.get_running_loop().create_future()
        self.waiting.append(released)
        try:
            await asyncio.wait_for(asyncio.shield(released), self.timeout)
        except TimeoutError:
            self.refused += 1
            if self.waiting_for:
                return f"held {self.timeout:g} s waiting for {self.waiting_for}"
            return f"held {self.timeout:g} s while {self.alias} switches to {self.new}; the switch is still running"
        finally:
            if not released.done():
                self.waiting.remove(released)  # timed out, or the client went away
        return self.failure

    def fail(self, reason: str) -> None:
        """Refuse every waiting request with `reason`."""
        self.failure = reason
        self.release()

    def release(self) -> None:
        """Let every waiting request go, first come first served."""
        self.done = True
        while self.waiting:
            self.waiting.popleft().set_result(None)

    def describe(self) -> dict[str, object]:
        return {"alias": self.alias, "from": self.old, "to": self.new, "held": len(self.waiting),
                "for_s": round(time.monotonic() - self.since, 3)}
