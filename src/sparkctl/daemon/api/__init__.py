"""The daemon's local API: HTTP over a unix socket in the state dir (mode 0600), for the CLI.

The two long-lived streams are NDJSON, or server-sent events when the request accepts
`text/event-stream` (the dashboard's EventSource, which resumes from `Last-Event-ID`).
Errors are JSON `{"error": {"message", "type"}}`; a bad request never stops the daemon.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from sparkctl.daemon.api import actions as on_action
from sparkctl.daemon.api import http
from sparkctl.daemon.api import queries as on_query
from sparkctl.daemon.api.service import CLOSING, COMMANDS, FOLLOWS, QUERIES, Commands, Gauge, Queries


def build(commands: Commands, queries: Queries, *, token: str | None = None,
          follows: Gauge | None = None, underway: dict[str, on_action.Underway] | None = None) -> web.Application:
    """The API app; with `token`, every request must carry `Authorization: Bearer <token>`.
    `follows`: the count of log follows, and `underway`: the actions under way by name (what a
    cancel names), each shared by every listener of the daemon's API."""
    middlewares = [http.errors] + ([http.bearer(token)] if token else [])
    app = web.Application(client_max_size=http.MAX_BODY, middlewares=middlewares)
    app[COMMANDS], app[QUERIES] = commands, queries
    app[CLOSING] = asyncio.Event()
    app[FOLLOWS] = follows if follows is not None else Gauge()
    app[on_action.UNDERWAY] = underway if underway is not None else {}
    app.on_shutdown.append(http.closing)
    app.router.add_get("/v1/status", on_query.status)
    app.router.add_get("/v1/stacks", on_query.stacks)
    app.router.add_get("/v1/desired", on_query.desired)
    app.router.add_post("/v1/up", on_action.up)
    app.router.add_post("/v1/pull", on_action.pull)
    app.router.add_post("/v1/cancel", on_action.cancel)
    app.router.add_post("/v1/down", on_action.down)
    app.router.add_post("/v1/switch", on_action.switch)
    app.router.add_post("/v1/route", on_action.route)
    app.router.add_post("/v1/park", on_action.park)
    app.router.add_post("/v1/wake", on_action.wake)
    app.router.add_post("/v1/retest", on_action.retest)
    app.router.add_post("/v1/bench", on_action.bench)
    app.router.add_post("/v1/patch-check", on_action.patch_check)
    app.router.add_post("/v1/image", on_action.image)
    app.router.add_post("/v1/fleet/up", on_action.fleet_up)
    app.router.add_post("/v1/fleet/down", on_action.fleet_down)
    app.router.add_post("/v1/fleet/ps", on_action.fleet_ps)
    app.router.add_get("/v1/events", on_query.events)
    app.router.add_get("/v1/logs", on_query.logs)
    app.router.add_get("/v1/runs", on_query.runs)
    app.router.add_get("/v1/series", on_query.series)
    app.router.add_get("/v1/chart", on_query.chart)
    app.router.add_get("/v1/reports", on_query.reports)
    app.router.add_get("/v1/report-file", on_query.report_file)
    app.router.add_post("/v1/report", on_action.compare)
    app.router.add_get("/v1/history", on_query.history)
    app.router.add_get("/metrics", on_query.metrics)
    return app
