"""The dashboard's boundary, without a browser: the gateway serves /ui and passes the page's API
calls to the daemon's API app (a real aiohttp app on a unix socket, over a recording service), and
refuses what a hostile page or local process could send: no key, a wrong key, a cross-origin
action, an action without the owner's session (a cookie carrying it included), a route the page
has no use for, more log follows than a client may hold. Server-sent events, log follows and an
action's event stream pass through as they come."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl import messages
from sparkctl.daemon.api import queries
from sparkctl.daemon.api.service import MAX_FOLLOWS
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.turns import Turns
from sparkctl.errors import SparkctlError
from sparkctl.gateway.login import Logins, login_code
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable
from sparkctl.gateway.ui import FOLLOWS_PER_CLIENT, Dashboard
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

    async def _log(self, stack: str, tail: int):
        if stack == "gone":  # its container went between the check and the follow
            raise SparkctlError("follow the logs of gone: Docker said 404: no such container")
        yield b""  # Docker accepted the follow
        yield f"{tail} lines\n".encode()
        await asyncio.Event().wait()  # no new line, ever: a follow must find its client gone without one

    def logs(self, stack: str, tail: int):
        return self._log(stack, tail)

    def status(self) -> dict:
        return {"stacks": [], "aliases": {"primary": "a"}}

    async def switch(self, alias: str, stack: str, *, ticket: int) -> messages.SwitchDone:
        async with self.turns.turn(f"alias:{alias}", ticket):
            self.bus.publish(messages.PhaseChanged(stack, "starting"))
            self.switched.append((alias, stack))
            return messages.SwitchDone(alias, stack, "blue/green")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Running, Service]]:
    service = Service()
    served_api = ServedApi(service, tmp_path / "api.sock")
    with served_api as sock:
        service.bus.loop = served_api.loop  # the test publishes from its own thread: it crosses to the API's loop
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
    assert status == 200 and "Set-Cookie" not in headers and "session" not in html.replace("sparkctl-session", "")
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
    assert not Logins(b"y" * 64).valid(session)


def test_a_used_login_code_is_refused_after_the_daemon_restarts() -> None:
    """The daemon builds its `Logins` once per run: a restart forgets the codes used, so a code
    made before the run began is refused, used or not."""
    now = [1_000_000.0]
    code = login_code(OWNER, now=now[0])
    assert Logins(OWNER, clock=lambda: now[0]).open_session(code)
    now[0] += 10  # the daemon restarts within the code's 5 minutes
    restarted = Logins(OWNER, clock=lambda: now[0])
    assert restarted.open_session(code) is None
    assert restarted.open_session(login_code(OWNER, now=now[0] + 0.001))  # a code of this run works


def test_reads_pass_through_and_actions_need_the_owner_the_same_origin_and_the_token(served) -> None:
    running, service = served
    status, _, body = ask(running, "GET", "/ui/api/v1/desired", Authorization=basic())
    assert status == 200 and json.loads(body)["aliases"] == {"primary": "a"}
    assert ask(running, "GET", "/ui/api/v1/retest", Authorization=basic())[0] == 404  # not the page's
    assert ask(running, "POST", "/ui/api/v1/status", {}, Authorization=basic())[0] == 405
    session = log_in(running)
    origin = running.url
    good = {"Authorization": basic(), "X_Sparkctl_Token": session, "Origin": origin,
            "Content_Type": "application/json", "Sec_Fetch_Site": "same-origin"}
    body = {"alias": "primary", "stack": "b"}
    other_port = "http://127.0.0.1:" + str(int(origin.rpartition(":")[2]) + 1)
    for bad in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Origin": "http://[::1"},
                {"Origin": other_port}, {"Sec_Fetch_Site": "same-site"}, {"Sec_Fetch_Site": "cross-site"},
                {"X_Sparkctl_Token": "forged"}, {"X_Sparkctl_Token": ""}):
        status, _, answer = ask(running, "POST", "/ui/api/v1/switch", body, **(good | bad))
        assert status == 403 and json.loads(answer)["error"]["code"] == "forbidden", bad
    no_origin = {k: v for k, v in good.items() if k != "Origin"}
    assert ask(running, "POST", "/ui/api/v1/switch", body, **no_origin)[0] == 403
    assert service.switched == []
    status, _, stream = ask(running, "POST", "/ui/api/v1/switch", body, **good)
    lines = [json.loads(line) for line in stream.splitlines()]
    assert status == 200 and [line["kind"] for line in lines] == ["phase", "outcome"] and lines[-1]["ok"]
    assert service.switched == [("primary", "b")]


def test_a_local_process_with_the_owners_cookie_or_page_cannot_act(served) -> None:
    """What any process on the host can get without the owner's key file: the page (any number of
    times), and what a browser sends it when the owner visits its own port of 127.0.0.1 (the
    browser's cookies for 127.0.0.1, whatever their port). Neither opens an action, replayed from
    the page's own origin; the login answer sets no cookie, and reloading the page many times
    does not log the owner out (nothing is kept per page load)."""
    running, service = served
    status, headers, _ = ask(running, "GET", f"/ui/login?code={login_code(OWNER)}", Authorization=basic())
    assert status == 303 and "Set-Cookie" not in headers
    session = headers["Location"].partition("#session=")[2]
    _, page_headers, html = ask(running, "GET", "/ui", Authorization=basic(), Cookie=f"sparkctl_session={session}")
    assert session not in html and "Set-Cookie" not in page_headers
    replay = {"Authorization": basic(), "Origin": running.url, "Content_Type": "application/json",
              "Cookie": f"sparkctl_session={session}"}
    for action, body in (("down", {"stack": "a"}), ("park", {"stack": "a", "how": "sleep-1"}),
                         ("switch", {"alias": "primary", "stack": "b"})):
        status, _, answer = ask(running, "POST", f"/ui/api/v1/{action}", body, **replay)
        assert status == 403 and "sparkctl dashboard" in json.loads(answer)["error"]["message"], action
    for _ in range(100):
        ask(running, "GET", "/ui", Authorization=basic())
    owner = {"Authorization": basic(), "X_Sparkctl_Token": session, "Origin": running.url,
             "Content_Type": "application/json"}
    assert ask(running, "POST", "/ui/api/v1/switch", {"alias": "primary", "stack": "b"}, **owner)[0] == 200
    assert service.switched == [("primary", "b")]


def log_in(running: Running) -> str:
    """The owner's login: the URL's code traded for a session, in the fragment of the page's address."""
    status, headers, _ = ask(running, "GET", f"/ui/login?code={login_code(OWNER)}", Authorization=basic())
    assert status == 303 and headers["Location"].startswith("/ui/#session=")
    return headers["Location"].partition("#session=")[2]


def test_events_reach_the_page_as_server_sent_events(served) -> None:
    running, service = served
    host = running.url.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request("GET", "/ui/api/v1/events", headers={"Host": host, "Authorization": basic(),
                                                      "Accept": "text/event-stream"})
    reply = conn.getresponse()
    assert reply.status == 200 and reply.getheader("Content-Type").startswith("text/event-stream")
    service.bus.publish(messages.Note("a", "hello"))
    got = b""
    while b"\n\n" not in got:
        got += reply.read1(4096)
    event = got.decode()
    assert event.startswith("id: 1\ndata: ") and json.loads(event.split("data: ", 1)[1])["text"] == "hello"
    conn.close()


def follow(host: str, path: str, headers: dict[str, str]) -> tuple[http.client.HTTPConnection, int, bytes]:
    """A log follow opened; its connection, status and first line (or error body)."""
    conn = http.client.HTTPConnection(host, timeout=10)
    conn.request("GET", path, headers={"Host": host, **headers})
    reply = conn.getresponse()
    if reply.status != 200:
        return conn, reply.status, reply.read()
    got = b""
    while b"\n\n" not in got:
        got += reply.read1(4096)
    return conn, reply.status, got


def test_a_client_holds_a_few_log_follows_and_a_follow_ends_when_its_client_leaves(served, monkeypatch) -> None:
    """Log follows pass through as they come; one client address may hold FOLLOWS_PER_CLIENT open
    (the next gets 429), and a follow whose client left is let go at once by the gateway and
    within a keep-alive by the daemon, with no new log line."""
    monkeypatch.setattr(queries, "KEEPALIVE", 0.2)
    running, _ = served
    host = running.url.removeprefix("http://")
    headers = {"Authorization": basic(), "Accept": "text/event-stream"}
    _, status, body = follow(host, "/ui/api/v1/logs?stack=gone", headers)  # Docker's refusal, as an answer
    assert status == 400 and "no such container" in json.loads(body)["error"]["message"]
    opened = [follow(host, "/ui/api/v1/logs?stack=a&tail=7", headers) for _ in range(FOLLOWS_PER_CLIENT)]
    assert [(status, line) for _, status, line in opened] == [(200, b'data: {"line": "7 lines"}\n\n')] * len(opened)
    _, status, body = follow(host, "/ui/api/v1/logs?stack=a", headers)
    assert status == 429 and json.loads(body)["error"]["code"] == "too_many_follows"
    for conn, _, _ in opened:
        conn.close()
    deadline = time.monotonic() + 5
    while running.gateway.ui.following and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running.gateway.ui.following
    conn, status, _ = follow(host, "/ui/api/v1/logs?stack=a", headers)
    assert status == 200
    conn.close()


def test_the_daemon_caps_log_follows_in_all(tmp_path: Path, monkeypatch) -> None:
    """Every listener of the API counts against one cap (the gateway's clients and the CLI's
    alike); beyond it, 503; a follow whose client left frees its place without a new line."""
    monkeypatch.setattr(queries, "KEEPALIVE", 0.2)
    with ServedApi(Service(), tmp_path / "api.sock") as sock:
        def open_one() -> tuple[socket.socket, bytes]:
            client = socket.socket(socket.AF_UNIX)
            client.connect(str(sock))
            client.sendall(b"GET /v1/logs?stack=a HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while b"\r\n\r\n" not in got:
                got += client.recv(4096)
            return client, got

        opened = [open_one() for _ in range(MAX_FOLLOWS)]
        assert all(head.startswith(b"HTTP/1.1 200") for _, head in opened)
        extra, head = open_one()
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 5" in head
        extra.close()
        for client, _ in opened:
            client.close()
        deadline = time.monotonic() + 5
        while True:
            client, head = open_one()
            client.close()
            if not head.startswith(b"HTTP/1.1 503") or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert head.startswith(b"HTTP/1.1 200")
