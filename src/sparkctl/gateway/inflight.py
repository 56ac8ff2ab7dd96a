"""The proxied requests in flight on the engines: a routed request is counted in the `Ledger`, takes
a slot on the replica `Replicas` picks, and is sent over the gateway's engine pool with its
`Bounds` on the engine's silence (`stall` for a stream, `first_byte` for a whole answer); its slot
is given back once it ends. An engine that refuses or resets a connection before answering, or
answers 503 (asleep without the daemon's word, or not serving), or stays silent past its bound,
is ejected, and a request nothing of whose answer was passed on goes
to another replica (a lone engine's failure is passed on, but for a stack placed across a fleet,
which the daemon re-places when its host dies). An engine or a host that leaves routing has its
unanswered requests moved and the answers under way there ended (the client sees an incomplete
response it can retry, an SSE stream an error event first). The `Gateway` (`proxy.py`) sends each
routed request here, and gets back, to route again, one whose replica failed it or whose stack's
replicas changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from sparkctl.gateway.exchange import Proxied
from sparkctl.gateway.ledger import Ledger
from sparkctl.gateway.pool import EnginePool
from sparkctl.gateway.replicas import Replicas
from sparkctl.gateway.upstream import UpstreamError

# Failed forwards a request to a placed stack may have beyond one per replica: each ejects the
# engine for EJECT_S, so this covers a host's death until the fleet's control plane declares it.
PLACED_RETRIES = 6


class InFlight:
    def __init__(self, on_engine: dict[str, set[Proxied]], replicas: Replicas, ledger: Ledger, *,
                 upstreams: EnginePool, route: Callable[[Proxied], None]) -> None:
        self.on_engine, self.replicas, self.ledger, self.upstreams = on_engine, replicas, ledger, upstreams
        self.route = route  # the gateway's, for a request that must go elsewhere

    def send(self, exchange: Proxied) -> None:
        """Count a routed request in and forward it, or wait for a replica under the stack's cap."""
        self.ledger.accepted(exchange.upstream.stack)
        url = self.replicas.take(exchange.upstream)
        if url is not None:
            self._forward(exchange, url)
        else:
            exchange.wait(self._after_cap(exchange))

    def finished(self, exchange: Proxied) -> None:
        if exchange.replica is not None:
            self._leave(exchange)
        self.ledger.finished(exchange.upstream.stack, forwarded=exchange.forwarded)

    def retry(self, exchange: Proxied, e: UpstreamError) -> bool:
        """The engine failed the request: it refused, reset or closed before answering, answered
        503 (`unanswered`: it served none of it), or fell silent (`stalled`). Eject it, and send an
        unanswered request to another replica, at most once per replica; False (the failure, or
        the engine's 503, goes to the client) for a lone engine on this Spark, which is never
        ejected. A stack placed across the fleet is held instead while none of its replicas is
        left (its host may be dying: the daemon re-places it), through a few ejections first."""
        upstream, url = exchange.upstream, exchange.replica
        if url is None or (len(upstream.urls) < 2 and not upstream.placed) or not (e.unanswered or e.stalled):
            return False
        tries = len(upstream.urls) + (PLACED_RETRIES if upstream.placed else 0)
        if exchange.started or not e.unanswered or exchange.tries >= tries:
            if e.stalled:
                self.replicas.eject(url)
            return False
        exchange.tries += 1
        self.replicas.eject(url)
        self._leave(exchange)
        self._reroute(exchange)
        return True

    def evacuate(self, urls: list[str], why: str) -> None:
        """The engines at `urls` left routing: move their unanswered requests, end their answers under way."""
        for url in [u for u in urls if u in self.on_engine]:
            for exchange in list(self.on_engine[url]):
                if exchange.started:
                    exchange.cut(why)
                else:
                    exchange.call.cancel()
                    self._leave(exchange)
                    self._reroute(exchange)

    async def _after_cap(self, exchange: Proxied) -> None:
        url = await self.replicas.wait(exchange.upstream)
        if url is None:  # the stack's replicas changed while it waited
            self._reroute(exchange)
        else:
            self._forward(exchange, url)

    def _forward(self, exchange: Proxied, url: str) -> None:
        self.ledger.forwarded(exchange.upstream.stack)
        exchange.forwarded, exchange.replica = True, url
        self.on_engine.setdefault(url, set()).add(exchange)
        # A hung engine, or one behind a cut link (which TCP takes ~15 min to notice), is silent: a
        # stream's may not be for `stall` at any point; a whole answer comes at once when it is
        # done, so only the wait for it is bounded.
        bounds, stream = exchange.bounds, bool(exchange.payload.get("stream"))
        exchange.call = self.upstreams.post(url, exchange.path, json.dumps(exchange.payload).encode(), exchange,
                                            exchange.upstream.headers, stall=bounds.stall if stream else None,
                                            first_byte=None if stream else bounds.first_byte)
        if exchange.conn.paused:
            exchange.call.pause()

    def _leave(self, exchange: Proxied) -> None:
        """The request no longer occupies its replica: the slot goes to the next waiter."""
        url, exchange.replica = exchange.replica, None
        self.on_engine[url].discard(exchange)
        self.replicas.give(url, exchange.upstream.stack)

    def _reroute(self, exchange: Proxied) -> None:
        """Route an accepted request again from the start (its replica failed, or its stack's
        replicas changed while it waited)."""
        self.ledger.finished(exchange.upstream.stack, forwarded=exchange.forwarded)
        exchange.upstream, exchange.forwarded, exchange.call = None, False, None
        self.route(exchange)
