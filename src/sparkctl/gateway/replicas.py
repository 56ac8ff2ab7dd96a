"""Which engine of a stack gets the next request: the gateway's load balancing and ejection.

A stack runs on one engine or on several (replicas, on any host of the fleet: `Upstream.urls`).
`Replicas` counts the requests in flight on each engine, picks the live replica with the fewest
(ties taken in turn) and queues a request, in arrival order, while every live replica of its stack
is at its cap. The cap is per replica: every enforced known issue is about what one engine takes
at once (a crash with two concurrent requests, one engine's KV cache at full context), so a stack
of N replicas takes N times its cap, and no engine ever more than its cap.

A replica is out of routing while it is ejected (for `EJECT_S` after a failure, or until restored),
held out, or on an ejected host; whatever brings one back calls `on_return`, which the `Gateway`
uses to let go the requests it held while its stack had no live replica. Lives on the gateway's
event loop; nothing here does I/O.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from functools import lru_cache
from urllib.parse import urlsplit

from sparkctl.gateway.routes import Upstream

EJECT_S = 5.0  # how long an engine that refused or reset a connection is left out


class Replicas:
    """In-flight counts and ejections by engine URL, and the requests waiting for a slot by stack."""

    def __init__(self, *, eject_s: float = EJECT_S, clock: Callable[[], float] = time.monotonic,
                 on_return: Callable[[], None] = lambda: None) -> None:
        self.eject_s, self.clock, self.on_return = eject_s, clock, on_return
        self.load: dict[str, int] = {}  # url -> requests forwarded to it and not finished
        self.failed: dict[str, float] = {}  # url -> until when it is left out (clock)
        self.hosts: set[str] = set()  # host addresses ejected as a whole
        self.waiting: dict[str, deque[tuple[asyncio.Future[str | None], Upstream]]] = {}  # stack -> in order
        self.turns: dict[str, int] = {}  # stack -> the next tie's winner

    # --- routing -----------------------------------------------------------------------------------
    def live(self, upstream: Upstream) -> list[str]:
        """The stack's replicas that are not ejected."""
        now = self.clock()
        return [url for url in upstream.urls
                if host_of(url) not in self.hosts and self.failed.get(url, -math.inf) <= now]

    def take(self, upstream: Upstream) -> str | None:
        """A live replica with a free slot, fewest in flight first, counted in flight; None when
        every live replica is at its cap or requests already wait for one (they go first)."""
        if self.waiting.get(upstream.stack):
            return None
        return self._choose(upstream)

    async def wait(self, upstream: Upstream) -> str | None:
        """Wait, in arrival order, for a slot on a replica: its URL (counted in flight), or None when
        the stack's replicas changed (ejected or back) and the caller should route again."""
        slot: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(upstream.stack, deque()).append((slot, upstream))
        try:
            return await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled() and slot.result() is not None:
                self.give(slot.result(), upstream.stack)  # handed a slot as the waiter left: pass it on
            raise

    def give(self, url: str, stack: str) -> None:
        """A request forwarded to `url` is over: its slot goes to the stack's first waiter."""
        self.load[url] -= 1
        self._hand_out(stack)

    # --- ejection ----------------------------------------------------------------------------------
    def eject(self, url: str) -> None:
        """Leave out an engine that refused or reset a connection, for `eject_s` (never shortening a
        longer exclusion: a request reset by a group's recreation must not end its hold-out)."""
        self.failed[url] = max(self.failed.get(url, -math.inf), self.clock() + self.eject_s)
        asyncio.get_running_loop().call_later(self.eject_s, self._returned)
        self._recheck()

    def hold_out(self, url: str) -> None:
        """Leave out an engine until `restore` (its group is being recreated)."""
        self.failed[url] = math.inf
        self._recheck()

    def restore(self, url: str) -> None:
        if self.failed.pop(url, None) is not None:
            self._returned()

    def eject_host(self, address: str) -> None:
        """Leave out every replica on the host at `address` until `restore_host`."""
        self.hosts.add(address)
        self._recheck()

    def restore_host(self, address: str) -> None:
        if address in self.hosts:
            self.hosts.discard(address)
            self._returned()

    def ejected(self) -> dict[str, object]:
        """What is out of routing now (for /health)."""
        now = self.clock()
        return {"hosts": sorted(self.hosts),
                "engines": {url: round(until - now, 1) if until != math.inf else "until restored"
                            for url, until in sorted(self.failed.items()) if until > now}}

    # --- helpers -----------------------------------------------------------------------------------
    def _choose(self, upstream: Upstream) -> str | None:
        live = self.live(upstream)
        cap = upstream.max_concurrency or math.inf
        if not live:
            return None
        turn = self.turns.get(upstream.stack, 0)
        order = live[turn % len(live):] + live[:turn % len(live)]
        best = min(order, key=lambda url: self.load.get(url, 0))  # min keeps the first of equals
        if self.load.get(best, 0) >= cap:
            return None
        self.turns[upstream.stack] = turn + 1
        self.load[best] = self.load.get(best, 0) + 1
        return best

    def _hand_out(self, stack: str) -> None:
        """Free slots to the stack's waiters, first come first served."""
        queue = self.waiting.get(stack)
        while queue:
            slot, upstream = queue[0]
            if slot.done():
                queue.popleft()
                continue
            url = self._choose(upstream)
            if url is None:
                return
            queue.popleft()
            slot.set_result(url)

    def _recheck(self) -> None:
        """The replicas changed: every waiter routes again (its stack may have none left)."""
        for queue in self.waiting.values():
            while queue:
                slot, _ = queue.popleft()
                if not slot.done():
                    slot.set_result(None)

    def _returned(self) -> None:
        self._recheck()
        self.on_return()


@lru_cache(maxsize=1024)
def host_of(url: str) -> str:
    """The host address in an engine URL (`http://10.213.7.3:8110` -> `10.213.7.3`)."""
    return urlsplit(url).hostname or ""
