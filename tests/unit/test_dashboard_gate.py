"""The dashboard's boundary, without a browser: the gateway serves /ui and passes the page's API
calls to the daemon's API app (a real aiohttp app on a unix socket, over a recording service), and
refuses what a hostile page could send: no key, a wrong key, a cross-origin action, an action
without the page's token, a route the page has no use for. Server-sent events and an action's
event stream pass through as they come."""

from __future__ import annotations

import base64
import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl import results, wire
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.turns import Turns
from sparkctl.gateway.login import Logins, login_code
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable
from sparkctl.gateway.ui import Dashboard
from tests.conftest import Running, ServedApi

KEY = "sk-test"
OWNER = b"k" * 64  # the dashboard key


class Service:
    """The API's commands (`aliases.switch`) and queries, faked."""

    def __init__(self) -> None:
        self.bus, self.turns, self.switched = EventBus(), Turns(), []
        self.aliases = self

    def check_stack(self, name: str) -> str:
        return name

    def desired(self):
        from sparkctl.state.desired import Desired

        return Desired(stacks=("a",), aliases={"primary": "a"})

    def status(self) -> dict:
        return {"stacks": [], "aliases": {"primary": "a"}}

    def switch(self, alias: str, stack: str, *, ticket: int) -> results.SwitchDone:
        with self.turns.turn(f"alias:{alias}", ticket):
            self.bus.publish(wire.PhaseChanged(stack, "starting"))
            self.switched.append((alias, stack))
            return results.SwitchDone(alias, stack, "blue/green")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Running, Service]]:
    service = Service()
    with ServedApi(service, tmp_path / "api.sock") as sock:
        gateway = Gateway(lambda: RouteTable(), api_keys=[KEY])
        gateway.ui = Dashboard(f"unix:{sock}", gateway.upstreams, Logins(OWNER))
        running = Running(gateway)
        try:
            yield running, service
        finally:
            running.stop()


def ask(running: Running, method: str, path: str, body: dict | None = None, **headers: str):
    host = running.url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request(method, path, json.dumps(body).encode() if body is not None else None,
                 {"Host": host, **{k.replace("_", "-"): v for k, v in headers.items()}})
    reply = conn.getresponse()
    return reply.status, dict(reply.getheaders()), reply.read().decode()


def basic(key: str = KEY) -> str:
    return "Basic " + base64.b64encode(f"me:{key}".encode()).decode()


def test_the_page_needs_the_key(served) -> None:
    running, _ = served
    status, headers, _ = ask(running, "GET", "/ui")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert ask(running, "GET", "/ui", Authorization=basic("wrong"))[0] == 401
    assert ask(running, "GET", "/ui/api/v1/status", Authorization="Bearer nope")[0] == 401
    status, headers, html = ask(running, "GET", "/ui", Authorization=basic())
    assert status == 200 and page_token(html) == "" and "Set-Cookie" not in headers  # no login: reads only
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    assert ask(running, "GET", "/ui/app.js", Authorization=f"Bearer {KEY}")[0] == 200


def test_a_login_url_opens_one_session_once_and_expires() -> None:
    now = [1_000_000.0]
    logins = Logins(OWNER, clock=lambda: now[0])
    code = login_code(OWNER, now=now[0])
    session = logins.open_session(code)
    assert session and logins.valid(session) and logins.open_session(code) is None  # once
    assert logins.open_session(login_code(b"x" * 64, now=now[0])) is None  # another key's
    assert logins.open_session(code[:-1] + ("0" if code[-1] != "0" else "1")) is None  # tampered
    late = login_code(OWNER, now=now[0])
    now[0] += 301
    assert logins.open_session(late) is None and logins.valid(session)  # a code lives 5 minutes
    now[0] += 31 * 86400
    assert not logins.valid(session)  # a session 30 days
    assert Logins(b"y" * 64).page_token(session) != logins.page_token(session)


def test_reads_pass_through_and_actions_need_the_owner_the_same_origin_and_the_token(served) -> None:
    running, service = served
    status, _, body = ask(running, "GET", "/ui/api/v1/desired", Authorization=basic())
    assert status == 200 and json.loads(body)["aliases"] == {"primary": "a"}
    assert ask(running, "GET", "/ui/api/v1/retest", Authorization=basic())[0] == 404  # not the page's
    assert ask(running, "POST", "/ui/api/v1/status", {}, Authorization=basic())[0] == 405
    session, token = log_in(running)
    origin = running.url
    good = {"Authorization": basic(), "Cookie": f"sparkctl_session={session}", "X_Sparkctl_Token": token,
            "Origin": origin, "Content_Type": "application/json"}
    body = {"alias": "primary", "stack": "b"}
    for bad in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Origin": "http://[::1"},
                {"X_Sparkctl_Token": "forged"}, {"Cookie": "sparkctl_session=forged"}, {"Cookie": ""}):
        status, _, answer = ask(running, "POST", "/ui/api/v1/switch", body, **(good | bad))
        assert status == 403 and json.loads(answer)["error"]["code"] == "forbidden", bad
    no_origin = {k: v for k, v in good.items() if k != "Origin"}
    assert ask(running, "POST", "/ui/api/v1/switch", body, **no_origin)[0] == 403
    assert service.switched == []
    status, _, stream = ask(running, "POST", "/ui/api/v1/switch", body, **good)
    lines = [json.loads(line) for line in stream.splitlines()]
    assert status == 200 and [line["kind"] for line in lines] == ["phase", "outcome"] and lines[-1]["ok"]
    assert service.switched == [("primary", "b")]


def test_a_local_process_that_loads_the_page_cannot_act(served) -> None:
    """What any process on the host can do without the owner's key: load the page, take whatever
    it hands out, replay it from the page's own origin. Refused; reloading the page many times
    does not log the owner out either (nothing is kept per page load)."""
    running, service = served
    session, token = log_in(running)
    _, headers, html = ask(running, "GET", "/ui", Authorization=basic())
    replay = {"Authorization": basic(), "Origin": running.url, "Content_Type": "application/json",
              "X_Sparkctl_Token": page_token(html), "Cookie": headers.get("Set-Cookie", "").split(";")[0]}
    for action, body in (("down", {"stack": "a"}), ("park", {"stack": "a", "how": "sleep-1"}),
                         ("switch", {"alias": "primary", "stack": "b"})):
        status, _, answer = ask(running, "POST", f"/ui/api/v1/{action}", body, **replay)
        assert status == 403 and "sparkctl dashboard" in json.loads(answer)["error"]["message"], action
    for _ in range(100):
        ask(running, "GET", "/ui", Authorization=basic())
    owner = {"Authorization": basic(), "Cookie": f"sparkctl_session={session}", "X_Sparkctl_Token": token,
             "Origin": running.url, "Content_Type": "application/json"}
    assert ask(running, "POST", "/ui/api/v1/switch", {"alias": "primary", "stack": "b"}, **owner)[0] == 200
    assert service.switched == [("primary", "b")]


def log_in(running: Running) -> tuple[str, str]:
    """The owner's login: the URL's code traded for a session cookie, then the page's token."""
    status, headers, _ = ask(running, "GET", f"/ui/login?code={login_code(OWNER)}", Authorization=basic())
    assert status == 303 and headers["Location"] == "/ui/"
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
    session = cookie.split(";")[0].removeprefix("sparkctl_session=")
    _, _, html = ask(running, "GET", "/ui", Authorization=basic(), Cookie=f"sparkctl_session={session}")
    assert page_token(html)
    return session, page_token(html)


def page_token(html: str) -> str:
    return re.search(r'name="sparkctl-token" content="([^"]*)"', html).group(1)


def test_events_reach_the_page_as_server_sent_events(served) -> None:
    running, service = served
    host = running.url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request("GET", "/ui/api/v1/events", headers={"Host": host, "Authorization": basic(),
                                                      "Accept": "text/event-stream"})
    reply = conn.getresponse()
    assert reply.status == 200 and reply.getheader("Content-Type").startswith("text/event-stream")
    service.bus.publish(wire.Note("a", "hello"))
    got = b""
    while b"\n\n" not in got:
        got += reply.read1(4096)
    event = got.decode()
    assert event.startswith("id: 1\ndata: ") and json.loads(event.split("data: ", 1)[1])["text"] == "hello"
    conn.close()
