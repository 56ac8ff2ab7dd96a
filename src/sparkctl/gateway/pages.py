"""What the gateway answers itself rather than passing on from an engine, in the shapes its
clients expect: the OpenAI error envelope, marked as sparkctl's so an agent can tell it from
the model server's, and the /v1/models, /health and Prometheus /metrics pages. The `Gateway`
serves them; they read its route table, its holds and its `Ledger`.
"""

from __future__ import annotations

from collections.abc import Callable

from sparkctl.gateway.hold import Hold
from sparkctl.gateway.ledger import Ledger
from sparkctl.gateway.routes import RouteTable
from sparkctl.gateway.server import Connection


class Pages:
    """The gateway's GET pages, by path (`by_path`)."""

    def __init__(self, routes: Callable[[], RouteTable], holds: dict[str, Hold], ledger: Ledger) -> None:
        self.routes, self.holds, self.ledger = routes, holds, ledger
        self.by_path = {"/v1/models": self.models, "/health": self.health, "/metrics": self.metrics}

    def health(self, conn: Connection) -> None:
        body: dict[str, object] = {"status": "ok", "models": len(self.routes().models())}
        if self.holds:
            body["switching"] = [h.describe() for h in self.holds.values()]
        conn.reply_json(200, body)

    def models(self, conn: Connection) -> None:
        cards = self.routes().models()
        listed = {c["id"] for c in cards}
        for hold in self.holds.values():  # a held alias stays listed, marked as switching
            cards = [c | {"switching": hold.describe()} if c["id"] == hold.alias else c for c in cards]
            if hold.alias not in listed:
                cards.insert(0, {"id": hold.alias, "object": "model", "owned_by": "sparkctl", "root": hold.new,
                                 "switching": hold.describe()})
        conn.reply_json(200, {"object": "list", "data": cards})

    def metrics(self, conn: Connection) -> None:
        counts = self.ledger.snapshot()
        lines = ["# TYPE sparkctl_gateway_requests_total counter"]
        lines += [f'sparkctl_gateway_requests_total{{stack="{s}",status="{c}"}} {n}'
                  for (s, c), n in sorted(counts.served.items())]
        lines.append("# TYPE sparkctl_gateway_in_flight gauge")
        lines += [f'sparkctl_gateway_in_flight{{stack="{s}"}} {n}' for s, n in sorted(counts.in_flight.items())]
        lines.append("# TYPE sparkctl_gateway_queued gauge")  # accepted, waiting at the stack's concurrency cap
        lines += [f'sparkctl_gateway_queued{{stack="{s}"}} {n - counts.in_flight.get(s, 0)}'
                  for s, n in sorted(counts.accepted.items())]
        lines.append("# TYPE sparkctl_gateway_routed_total counter")
        lines += [f'sparkctl_gateway_routed_total{{alias="{a}",rule="{i}",stack="{s}"}} {n}'
                  for (a, i, s), n in sorted(counts.routed.items())]
        lines.append("# TYPE sparkctl_gateway_held gauge")
        lines += [f'sparkctl_gateway_held{{alias="{a}"}} {len(h.waiting)}' for a, h in sorted(self.holds.items())]
        conn.reply(200, ("\n".join(lines) + "\n").encode(), "text/plain; charset=utf-8")

