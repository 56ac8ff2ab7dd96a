"""The gateway's per-stack request counts, and the drain a switch waits on.

The `Gateway` and each proxied request tell the ledger what happened to a request (accepted by
routing, forwarded to its engine, answered with a status, finished); the ledger keeps the counts
the /metrics page shows and wakes whoever waits for a stack to drain the moment its last
accepted request finishes, so a switch never polls. Lives on the gateway's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Snapshot:
    """The counts at one moment."""

    served: dict[tuple[str, int], int]  # (stack, status) -> responses
    in_flight: dict[str, int]  # stack -> forwarded upstream now
    accepted: dict[str, int]  # stack -> routed and not finished (incl. queued at a cap)
    peak: dict[str, int]  # stack -> most requests ever in flight at once
    routed: dict[tuple[str, int, str], int]  # (routed alias, rule index, its stack) -> requests


class Ledger:
    """One gateway's counts, by stack."""

    def __init__(self) -> None:
        self._in_flight: defaultdict[str, int] = defaultdict(int)
        self._accepted: defaultdict[str, int] = defaultdict(int)
        self._peak: defaultdict[str, int] = defaultdict(int)
        self._served: defaultdict[tuple[str, int], int] = defaultdict(int)
        self._routed: defaultdict[tuple[str, int, str], int] = defaultdict(int)
        self._drained: dict[str, asyncio.Event] = {}  # stack -> set when its last accepted request finishes
        self._last: dict[str, float] = {}  # stack -> when its last request finished (monotonic)

    def accepted(self, stack: str) -> None:
        """Routed to `stack`; counted before any wait at a cap, so a drain waits for it too."""
        self._accepted[stack] += 1

    def routed(self, alias: str, rule: int, stack: str) -> None:
        """A request to a routed alias went by its rule number `rule` (to `stack`)."""
        self._routed[(alias, rule, stack)] += 1

    def forwarded(self, stack: str) -> None:
        self._in_flight[stack] += 1
        self._peak[stack] = max(self._peak[stack], self._in_flight[stack])

    def answered(self, stack: str, status: int) -> None:
        self._served[(stack, status)] += 1

    def finished(self, stack: str, *, forwarded: bool) -> None:
        """Answered, failed or abandoned by its client: the last one wakes a drain."""
        if forwarded:
            self._in_flight[stack] -= 1
        self._accepted[stack] -= 1
        self._last[stack] = time.monotonic()
        if not self._accepted[stack] and (drained := self._drained.pop(stack, None)) is not None:
            drained.set()

    def quiet_since(self, stack: str) -> float | None:
        """When the stack's last request finished (0.0: none yet); None while it has requests."""
        return None if self._accepted.get(stack) else self._last.get(stack, 0.0)

    async def wait_drained(self, stack: str, timeout: float) -> bool:
        """Wait until the stack has no accepted request left; False if `timeout` passed first."""
        if not self._accepted[stack]:
            return True
        drained = self._drained.setdefault(stack, asyncio.Event())
        try:
            await asyncio.wait_for(drained.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def snapshot(self) -> Snapshot:
        return Snapshot(served=dict(self._served), in_flight=dict(self._in_flight), accepted=dict(self._accepted),
                        peak=dict(self._peak), routed=dict(self._routed))
