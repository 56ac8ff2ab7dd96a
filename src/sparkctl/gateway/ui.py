"""The dashboard: the page at /ui on the gateway's address, its assets, and the daemon's own API
under /ui/api/ for the page's script. The page reads and acts through the very API the CLI uses
(the daemon's unix socket, reached through the gateway's engine pool), so there is no second
source of truth: its live updates are the API's event stream as server-sent events, a switch's
progress is the switch's own event stream.

Security, beside the gateway's Host check (docs/design.md, "The dashboard's boundary"):
- with API keys configured, /ui needs one; a browser sends it as HTTP Basic's password (any user
  name), which the gateway asks for;
- every action needs the owner's session (`login.py`), which only a one-time login URL from
  `sparkctl dashboard` opens. The login answers with the session in the address's fragment (never
  sent to a server); the page keeps it in its origin's storage and sends it in `X-Sparkctl-Token`.
  Not a cookie: a browser sends 127.0.0.1's cookies to every port of 127.0.0.1, so any local
  server the browser visits would get one, while an origin's storage is its port's alone. No
  answer of the gateway carries a session, so a local process, a model container on the host
  network included, can load the page and read but not act. Reads need no session: they change
  nothing, carry no secret, and show what `/v1/models` and `/metrics` already show any local process;
- a state-changing request must also come from the page's own origin: Origin is exactly the Host
  it was sent to, and a browser's `Sec-Fetch-Site`, when sent, says same-origin. A hostile page,
  on another port or anywhere, can neither read the session nor send that header without a CORS
  preflight, which the gateway never grants;
- a client may hold `FOLLOWS_PER_CLIENT` log follows open through the page (the daemon caps all
  follows): more answer 429;
- only the API's read routes and its stack and alias actions are reachable, the page's scripts
  run under a strict Content-Security-Policy, and the API's answers carry no secret.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from importlib import resources
from urllib.parse import parse_qs

from sparkctl.gateway.access import same_origin
from sparkctl.gateway.login import Logins
from sparkctl.gateway.passthrough import Passed
from sparkctl.gateway.pool import EnginePool
from sparkctl.gateway.request import Request
from sparkctl.gateway.server import Connection, error
from sparkctl.gateway.upstream import UpstreamError

PREFIX = "/ui"
FOLLOWS_PER_CLIENT = 4  # log follows one client address holds open: a page follows one log, so a few tabs fit
ASSETS = {"/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
          "/ui/app.css": ("app.css", "text/css; charset=utf-8")}
READS = {"/v1/status", "/v1/desired", "/v1/events", "/v1/history", "/v1/logs", "/v1/runs", "/v1/reports",
         "/v1/report-file", "/v1/series", "/v1/chart"}
ACTIONS = {"/v1/up", "/v1/down", "/v1/park", "/v1/wake", "/v1/switch", "/v1/report"}
NO_STORE = [("Cache-Control", "no-store")]
PAGE_HEADERS = [("Cache-Control", "no-store"), ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"),
                ("X-Content-Type-Options", "nosniff"),
                ("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
                                            "base-uri 'none'; form-action 'none'")]


class Dashboard:
    """Answers every request under /ui; `api`: the daemon's API (`unix:/path/to/sparkctl.sock`)."""

    def __init__(self, api: str, pool: EnginePool, logins: Logins) -> None:
        self.api, self.pool, self.logins = api, pool, logins
        self.following: Counter[str] = Counter()  # log follows open, by client address
        folder = resources.files(__package__) / "ui"
        self.files = {name: (folder / name).read_bytes() for name in ("index.html", "app.js", "app.css")}

    def handle(self, request: Request, conn: Connection) -> None:
        path, method = request.path, request.method
        if path in (PREFIX, PREFIX + "/") and method == "GET":
            self.page(request, conn)
        elif path == PREFIX + "/login" and method == "GET":
            self.login(request, conn)
        elif path in ASSETS and method == "GET":
            name, kind = ASSETS[path]
            conn.reply(200, self.files[name], kind, [("Cache-Control", "no-cache"), ("X-Content-Type-Options",
                                                                                    "nosniff")])
        elif (target := path.removeprefix(PREFIX + "/api")) == "/v1/logs" and method == "GET":
            self.follow(request, conn, target)
        elif target in READS and method == "GET":
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
        """The page, the same for everyone: what it may do is the session its origin's storage holds."""
        conn.reply(200, self.files["index.html"], "text/html; charset=utf-8", PAGE_HEADERS)

    def login(self, request: Request, conn: Connection) -> None:
        """A login URL's code traded for a session, handed to the page in the fragment of the address
        it is sent on to (the page moves it to its storage and out of the address)."""
        code = parse_qs(request.query).get("code", [""])[0]
        session = self.logins.open_session(code)
        if session is None:
            error(conn, 403, "this login link is expired, was used already or was made before the daemon "
                  "restarted: run `sparkctl dashboard` for a new one", "forbidden")
            return
        conn.reply(303, b"", "text/plain", [("Location", f"{PREFIX}/#session={session}"), *PAGE_HEADERS])

    def forbidden(self, request: Request) -> str | None:
        """Why a state-changing request is refused: not from the page's origin, or without the
        owner's session."""
        origin, host = request.headers.get("origin", ""), request.headers.get("host", "")
        site = request.headers.get("sec-fetch-site", "same-origin")
        if not same_origin(origin, host) or site != "same-origin":
            return f"cross-origin request refused (Origin {origin[:80]!r}, Host {host[:80]!r}, Sec-Fetch-Site " \
                   f"{site[:20]!r})"
        if not self.logins.valid(request.headers.get("x-sparkctl-token", "")):
            return "actions need the owner's login: run `sparkctl dashboard` and open the URL it prints"
        return None

    def follow(self, request: Request, conn: Connection, target: str) -> None:
        """A log follow, counted against its client's `FOLLOWS_PER_CLIENT` until it ends, however it ends."""
        peer = conn.transport.get_extra_info("peername") if conn.transport is not None else None
        client = str(peer[0]) if peer else ""
        if self.following[client] >= FOLLOWS_PER_CLIENT:
            error(conn, 429, f"{FOLLOWS_PER_CLIENT} log follows are open from {client or 'this client'} already: "
                  "close one (a page or tab that follows a log)", "too_many_follows", headers=[("Retry-After", "5")])
            return
        self.following[client] += 1

        def release() -> None:
            self.following[client] -= 1
            if not self.following[client]:
                del self.following[client]

        self.forward(request, conn, target, Counted(conn, release))

    def forward(self, request: Request, conn: Connection, target: str, passed: Passed | None = None) -> None:
        passed = conn.exchange = passed or Passed(conn, _unanswered, NO_STORE)
        headers = [("Content-Type", "application/json")] if request.body else []
        headers += [("Accept", a)] if (a := request.headers.get("accept")) else []
        query = f"?{request.query}" if request.query else ""
        passed.call = self.pool.send(self.api, request.method, target + query, request.body, passed, headers)


class Counted(Passed):
    """A long-lived read passed on, calling `release` once when it ends: its last byte, a failure,
    or its client leaving."""

    def __init__(self, conn: Connection, release: Callable[[], None]) -> None:
        super().__init__(conn, _unanswered, NO_STORE)
        self.release: Callable[[], None] | None = release

    def body(self, piece: bytes, last: bool) -> None:
        super().body(piece, last)
        if last:
            self._ended()

    def failed(self, e: UpstreamError) -> None:
        super().failed(e)
        self._ended()

    def cancel(self) -> None:
        super().cancel()
        self._ended()

    def _ended(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            release()


def _unanswered(conn: Connection, e: UpstreamError) -> None:
    error(conn, 502, f"the daemon's API did not answer ({e})", "daemon_unavailable")
