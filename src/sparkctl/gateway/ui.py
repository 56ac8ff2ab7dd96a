"""The dashboard: the page at /ui on the gateway's address, its assets, and the daemon's own API
under /ui/api/ for the page's script. The page reads and acts through the very API the CLI uses
(the daemon's unix socket, reached through the gateway's engine pool), so there is no second
source of truth: its live updates are the API's event stream as server-sent events, a switch's
progress is the switch's own event stream.

Security, beside the gateway's Host check:
- with API keys configured, /ui needs one; a browser sends it as HTTP Basic's password (any user
  name), which the gateway asks for;
- every action needs the owner's session (`login.py`): a cookie (HttpOnly, SameSite=Strict) that
  only a one-time login URL from `sparkctl dashboard` sets, so no other local process, a model
  container on the host network included, can act through the page. Reads need no session: they
  change nothing, carry no secret, and show what `/v1/models` and `/metrics` already show any
  local process;
- a state-changing request must also come from the page's own origin (Origin is the Host it was
  sent to) and carry the page's token in `X-Sparkctl-Token`, derived from the session. A hostile
  page that a browser on the Spark visits can neither read the token nor send that header
  without a CORS preflight, which the gateway never grants;
- only the API's read routes and its stack and alias actions are reachable, the page's scripts
  run under a strict Content-Security-Policy, and the API's answers carry no secret.
"""

from __future__ import annotations

import hmac
from http.cookies import CookieError, SimpleCookie
from importlib import resources
from urllib.parse import parse_qs, urlsplit

from sparkctl.gateway.login import SESSION_TTL, Logins
from sparkctl.gateway.passthrough import Passed
from sparkctl.gateway.pool import EnginePool
from sparkctl.gateway.request import AS_GET, Request
from sparkctl.gateway.server import Connection, error
from sparkctl.gateway.upstream import UpstreamError

PREFIX = "/ui"
COOKIE = "sparkctl_session"
ASSETS = {"/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/ui/app.css": ("app.css", "text/css; charset=utf-8")}
READS = {"/v1/status", "/v1/desired", "/v1/events", "/v1/history", "/v1/logs", "/v1/runs", "/v1/reports",
         "/v1/report-file", "/v1/series", "/v1/chart"}
ACTIONS = {"/v1/up", "/v1/down", "/v1/park", "/v1/wake", "/v1/switch", "/v1/report"}
PAGE_HEADERS = [("Cache-Control", "no-store"), ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"),
                ("X-Content-Type-Options", "nosniff"),
                ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                            "base-uri 'none'; form-action 'none'")]


class Dashboard:
    """Answers every request under /ui; `api`: the daemon's API (`unix:/path/to/sparkctl.sock`)."""

    def __init__(self, api: str, pool: EnginePool, logins: Logins) -> None:
        self.api, self.pool, self.logins = api, pool, logins
        folder = resources.files(__package__) / "ui"
        self.files = {name: (folder / name).read_bytes() for name in ("index.html", "app.js", "app.css")}

    def handle(self, request: Request, conn: Connection) -> None:
        path, method = request.path, request.method
        if path in (PREFIX, PREFIX + "/") and method in AS_GET:
            self.page(request, conn)
        elif path == PREFIX + "/login" and method == "GET":
            self.login(request, conn)
        elif path in ASSETS and method in AS_GET:
            name, kind = ASSETS[path]
            conn.reply(200, self.files[name], kind, [("Cache-Control", "no-cache"), ("X-Content-Type-Options",
                                                                                    "nosniff")])
        elif (target := path.removeprefix(PREFIX + "/api")) in READS and method == "GET":
            self.forward(request, conn, target)
        elif target in ACTIONS and method == "POST":
            problem = self.forbidden(request)
            if problem:
                error(conn, 403, problem, "forbidden")
            else:
                self.forward(request, conn, target)
        elif target in READS | ACTIONS:
            error(conn, 405, f"{method} is not allowed on {path}", "method_not_allowed")
        else:
            error(conn, 404, f"no route {path}", "not_found")

    def page(self, request: Request, conn: Connection) -> None:
        """The page, with the token of the browser's session (none before a login: it can read only)."""
        session = self._session(request)
        token = self.logins.page_token(session) if session else ""
        html = self.files["index.html"].replace(b"{{token}}", token.encode())
        conn.reply(200, html, "text/html; charset=utf-8", PAGE_HEADERS)

    def login(self, request: Request, conn: Connection) -> None:
        """A login URL's code traded for a session cookie, then on to the page."""
        code = parse_qs(request.query).get("code", [""])[0]
        session = self.logins.open_session(code)
        if session is None:
            error(conn, 403, "this login link is expired or was used already: run `sparkctl dashboard` for a new one",
                  "forbidden")
            return
        cookie = f"{COOKIE}={session}; Path={PREFIX}; Max-Age={int(SESSION_TTL)}; HttpOnly; SameSite=Strict"
        conn.reply(303, b"", "text/plain", [("Location", PREFIX + "/"), ("Set-Cookie", cookie), *PAGE_HEADERS])

    def forbidden(self, request: Request) -> str | None:
        """Why a state-changing request is refused: not from the page's origin, without the owner's
        session, or without its page's token."""
        origin, host = request.headers.get("origin", ""), request.headers.get("host", "")
        if not origin or _netloc(origin) != host.lower():
            return f"cross-origin request refused (Origin {origin[:80]!r}, Host {host[:80]!r})"
        session = self._session(request)
        if session is None:
            return "actions need the owner's login: run `sparkctl dashboard` and open the URL it prints"
        given = request.headers.get("x-sparkctl-token", "")
        if not hmac.compare_digest(given.encode(), self.logins.page_token(session).encode()):
            return "missing or stale page token: reload the page"
        return None

    def owner(self, request: Request) -> bool:
        """Whether the request carries the owner's login session."""
        return self._session(request) is not None

    def _session(self, request: Request) -> str | None:
        """The browser's session, if its cookie holds a valid one."""
        try:
            cookie = SimpleCookie(request.headers.get("cookie", "")).get(COOKIE)
        except CookieError:
            return None
        return cookie.value if cookie is not None and self.logins.valid(cookie.value) else None

    def forward(self, request: Request, conn: Connection, target: str) -> None:
        passed = conn.exchange = Passed(conn, _unanswered, [("Cache-Control", "no-store")])
        headers = [("Content-Type", "application/json")] if request.body else []
        headers += [("Accept", a)] if (a := request.headers.get("accept")) else []
        query = f"?{request.query}" if request.query else ""
        passed.call = self.pool.send(self.api, request.method, target + query, request.body, passed, headers)


def _netloc(origin: str) -> str | None:
    """An Origin's host and port, lower case; None when it is not a URL (`http://[::1`)."""
    try:
        return urlsplit(origin).netloc.lower()
    except ValueError:
        return None


def _unanswered(conn: Connection, e: UpstreamError) -> None:
    error(conn, 502, f"the daemon's API did not answer ({e})", "daemon_unavailable")
