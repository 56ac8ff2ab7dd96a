"""The dashboard in a real browser (Debian's Chromium, driven by Playwright) against a real daemon,
dockerd and sim engines, with API keys and an HF token configured: the page shows the running
stacks and the memory bar, a click switches `primary` with its progress step by step while an
agent loop sees no failed request, the gateway panel's counts move with that load, the log
follows. Security: the page and its API need the key; actions need the owner's login (the URL
`sparkctl dashboard` prints), kept by the page in its origin's storage; a cross-origin POST to
each action, or one without the session's header, is refused, and a page on another port of
127.0.0.1 that the owner's browser visits gets nothing to act with; the HF token appears in no
page, asset or event stream. Log follows hold no worker thread of the daemon, however many.
Screenshots of the views land in the test's temporary dir, or in SPARKCTL_SCREENSHOTS_DIR when set
(`make screenshots` sets it to docs/screenshots/, the tracked copies)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest
from playwright import sync_api

from sparkctl.state.store import Store
from tests.conftest import HUB_TOKEN, name, wait_for
from tests.conftest import _missing as missing
from tests.fakes.repos import DSPARK_DRAFT, QWEN_NVFP4
from tests.integration.agents import A, B, amend

KEY = "sk-dashboard-test"
AXE = Path(os.environ.get("SPARKCTL_BUILD_CACHE", Path.home() / ".cache" / "sparkctl-build")) / "axe-core-4.14.1" / \
    "axe.min.js"  # scripts/axe-setup.sh
CHROMIUM = shutil.which("chromium")
ACTIONS = ("up", "down", "park", "wake", "switch")



def basic(key: str = KEY) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"owner:{key}".encode()).decode()}


def fetch(url: str, *, method: str = "GET", body: bytes | None = None,
          headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, body, headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def login_path(cli) -> str:
    """The path and code of the one-time login URL that `sparkctl dashboard` prints."""
    code, out, err = cli("dashboard")
    assert code == 0 and "/ui/login?code=" in out, err
    return "/ui/login?code=" + out.strip().split("/ui/login?code=", 1)[1]


@pytest.fixture
def daemon(switching, monkeypatch):
    monkeypatch.setenv("SPARKCTL_GATEWAY_API_KEYS", KEY)
    monkeypatch.setenv("SPARKCTL_HF_TOKEN", HUB_TOKEN)
    return switching(small=True, key=KEY)


def streamed(url: str, seconds: float = 2.0) -> str:
    """What a long-lived stream sends within `seconds`."""
    got = b""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={**basic(), "Accept": "text/event-stream"}),
                                    timeout=seconds) as reply:
            while piece := reply.read1(65536):
                got += piece
    except TimeoutError:
        pass
    return got.decode()


def bench(cli, stack: str) -> None:
    code, _, err = cli("bench", "run", stack, "--profile", "quick", "--depths", "0")
    assert code == 0, err


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the views' screenshots go: the test's own dir, unless SPARKCTL_SCREENSHOTS_DIR names one
    (`make screenshots` points it at docs/screenshots/); a test never rewrites tracked files."""
    chosen = os.environ.get("SPARKCTL_SCREENSHOTS_DIR")
    folder = Path(chosen) if chosen else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser():
    if CHROMIUM is None:
        missing("Debian's chromium is not installed (`make test` installs it)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield chromium
        chromium.close()


def test_the_dashboard_shows_switches_and_follows_in_a_real_browser(daemon, browser, cli, shots) -> None:
    ui = daemon.gateway + "/ui"
    page = browser.new_page(http_credentials={"username": "owner", "password": KEY},
                            viewport={"width": 1280, "height": 900})
    seen: list[str] = []
    page.on("response", lambda r: seen.append(r.text()) if r.url.startswith(daemon.gateway)
            and "event-stream" not in (r.headers.get("content-type") or "") else None)
    page.goto(daemon.gateway + login_path(cli))  # the owner's login, then on to the page
    assert page.url.rstrip("/") == ui
    row = page.locator(f'#stacks tr[data-stack="{A}"]')
    sync_api.expect(row).to_contain_text("running", timeout=20_000)
    sync_api.expect(row).to_contain_text(re.compile(r"sha256:[0-9a-f]{12}.*(known-good|pinned|unpinned)"))
    sync_api.expect(row.locator(".timeline")).to_have_text(re.compile(r"^resolving 0\.\d s, .*running \d+\.\d s$"))
    sync_api.expect(page.locator("#memory span").first).to_have_attribute("title", re.compile(rf"{A}: 40 %"))
    sync_api.expect(page.locator("#live")).to_contain_text("live", timeout=10_000)
    page.screenshot(path=str(shots / "dashboard.png"), full_page=True)

    bench(cli, A)  # before the switch stops it: Compare gets a run of each
    client = openai.OpenAI(base_url=daemon.gateway + "/v1", api_key=KEY, max_retries=0, timeout=120)
    failed, served, stop = [], [], threading.Event()

    def agent() -> None:
        while not stop.is_set():
            try:
                reply = client.completions.with_raw_response.create(model="primary", prompt="x", max_tokens=2)
                served.append(reply.headers["x-sparkctl-stack"])
            except openai.OpenAIError as e:
                failed.append(repr(e))

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        answered = page.locator(f'#gateway tr[data-stack="{A}"] .answered')
        sync_api.expect(answered).not_to_have_text("0", timeout=10_000)
        before = int(answered.inner_text())
        sync_api.expect(answered).not_to_have_text(str(before), timeout=10_000)  # the panel moves with the load
        engine = page.locator(f'#gateway tr[data-stack="{A}"]')  # the daemon's samples, 5 s apart
        sync_api.expect(engine.locator(".tps")).to_have_text(re.compile(r"^(?!0\.0)\d+\.\d$"), timeout=30_000)
        sync_api.expect(engine.locator(".ttft")).to_have_text(re.compile(r"^\d+ ms$"), timeout=30_000)
        for chart in ("tps", "ttft", "requests", "memory"):
            image = page.locator(f"#chart-{chart}")
            wait_for(lambda image=image: image.evaluate("img => img.complete && img.naturalWidth > 0"), timeout=20,
                     what=f"the {chart} chart drawn")

        page.select_option("#switch-primary", B)
        page.get_by_role("button", name="switch primary").click()
        progress = page.locator("#switch-progress li")
        sync_api.expect(progress.last).to_contain_text(f"done: primary -> {B}", timeout=120_000)
        steps = progress.all_inner_texts()
        assert any(f"{B}:" in s for s in steps[1:-1]), steps  # the new stack's deploy phases, as they came
        page.screenshot(path=str(shots / "switch.png"), full_page=True)
        wait_for(lambda: served and served[-1] == B, timeout=30, what="the agent answered by the new stack")
        series = json.loads(page.evaluate("() => fetch('/ui/api/v1/series').then(r => r.text())"))
        assert any(what == f"primary: {A} → {B}" for _, what in series["switches"]), series["switches"]
        assert any(tps for tps in series["stacks"][A]["tps"]), series["stacks"][A]
        svg = page.evaluate("() => fetch('/ui/api/v1/chart?name=tps').then(r => r.text())")
        assert svg.startswith("<svg") and f">{A}</text>" in svg and "<title>primary: " in svg  # the switch, marked
    finally:
        stop.set()
        thread.join(60)
    assert not failed, failed[:3]
    sync_api.expect(page.locator('#aliases li[data-alias="primary"] .target')).to_have_text(B, timeout=10_000)

    bench(cli, B)
    page.reload()
    sync_api.expect(page.locator("#runs input[type=checkbox]")).to_have_count(2, timeout=10_000)
    for box in page.locator("#runs input[type=checkbox]").all():
        box.check()
    page.get_by_role("button", name="compare the selected runs").click()
    sync_api.expect(page.locator("#report h3").first).to_be_visible(timeout=60_000)
    graph = page.locator("#report img").first
    sync_api.expect(graph).to_be_visible(timeout=10_000)
    wait_for(lambda: graph.evaluate("img => img.complete && img.naturalWidth > 0"), timeout=10,
             what=f"the graph {graph.get_attribute('src')} loaded")
    sync_api.expect(page.locator("#report table").first).to_contain_text(A)
    page.screenshot(path=str(shots / "report.png"), full_page=True)
    accepted = page.locator(f'#stacks tr[data-stack="{B}"] .acceptance')  # the engine's own counters
    sync_api.expect(accepted).to_have_text(re.compile(r"^\d+ %$"))

    page.select_option("#log-stack", B)
    # B's newest line as Docker has it (the benchmark's requests pushed its start out of the pane's tail)
    newest = subprocess.run(["docker", "logs", "--tail", "1", name(B)], capture_output=True, text=True, check=True)
    sync_api.expect(page.locator("#logs")).to_contain_text((newest.stdout + newest.stderr).strip(), timeout=20_000)
    lines = page.locator("#logs").inner_text().count("\n")
    client.completions.create(model="primary", prompt="x", max_tokens=2)  # the engine logs its access line
    wait_for(lambda: page.locator("#logs").inner_text().count("\n") > lines, timeout=20, what="a new log line")
    page.screenshot(path=str(shots / "logs.png"), full_page=True)

    if not AXE.is_file():
        missing(f"{AXE} is missing (scripts/axe-setup.sh fetches it)")
    checked = browser.new_page(http_credentials={"username": "owner", "password": KEY}, bypass_csp=True)
    checked.goto(ui)
    sync_api.expect(checked.locator("#stacks tbody tr").first).to_be_visible(timeout=20_000)
    checked.add_script_tag(path=str(AXE))  # axe-core's WCAG 2 A and AA rules, contrast included
    found = checked.evaluate("axe.run(document, {runOnly: ['wcag2a', 'wcag2aa']})")
    assert not found["violations"], [(v["id"], [n["html"][:120] for n in v["nodes"][:3]]) for v in found["violations"]]
    assert found["passes"]
    for control in page.locator("button, select").all():  # every control is labelled
        label = control.get_attribute("aria-label") or control.inner_text().strip()
        if control.evaluate("e => e.tagName") == "SELECT":
            label = page.locator(f'label[for="{control.get_attribute("id")}"]').inner_text()
        assert label, control.evaluate("e => e.outerHTML")
    assert not any(HUB_TOKEN in text for text in seen)
    page.set_viewport_size({"width": 390, "height": 844})  # a phone: one column, no page-wide scroll
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(shots / "phone.png"))


def test_the_dashboard_shows_each_fetch_stream_of_an_up_at_once(slow_hub, start_daemon, browser, cli,
                                                                 monkeypatch) -> None:
    """A first `up` fetches its model and draft at once (the image is here): both bars show together,
    and go once the deploy moves on."""
    monkeypatch.setenv("SPARKCTL_GATEWAY_API_KEYS", KEY)
    start_daemon()
    gateway = f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"
    page = browser.new_page(http_credentials={"username": "owner", "password": KEY})
    page.goto(gateway + login_path(cli))
    sync_api.expect(page.locator("#live")).to_contain_text("live", timeout=10_000)
    up = subprocess.Popen([sys.executable, "-m", "sparkctl", "up", "qwen36-dflash"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    try:
        streams = page.locator("#fetches li")
        model = streams.filter(has_text=re.compile(rf"^qwen36-dflash: model {QWEN_NVFP4} \d+ of 4\d MB"))
        sync_api.expect(model).to_have_count(1, timeout=60_000)  # the slow file (40 MB, ~20 s) under way
        sync_api.expect(streams.filter(has_text=f"qwen36-dflash: draft {DSPARK_DRAFT}")).to_have_count(1)
        sync_api.expect(streams.locator("progress")).to_have_count(2)
        assert model.locator("progress").evaluate("bar => bar.value < bar.max")  # together, while the model comes
    finally:
        out, err = up.communicate(timeout=180)
    assert up.returncode == 0, err
    sync_api.expect(streams).to_have_count(0, timeout=20_000)


def test_the_dashboard_needs_the_key_and_refuses_cross_site_actions(daemon, cli) -> None:
    ui = daemon.gateway + "/ui"
    assert fetch(ui)[0] == 401 and fetch(ui, headers=basic("wrong"))[0] == 401
    assert fetch(ui + "/api/v1/status")[0] == 401
    host = daemon.gateway.removeprefix("http://")
    conn = http.client.HTTPConnection(host, timeout=30)
    conn.request("GET", login_path(cli), headers=basic())
    reply = conn.getresponse()
    assert reply.status == 303 and reply.getheader("Set-Cookie") is None, reply.read()
    session = reply.getheader("Location").partition("#session=")[2]
    status, html = fetch(ui, headers={**basic(), "Cookie": f"sparkctl_session={session}"})
    assert status == 200 and HUB_TOKEN not in html and session not in html
    body = {"up": {"stack": B}, "down": {"stack": A}, "park": {"stack": A}, "wake": {"stack": A},
            "switch": {"alias": "primary", "stack": B}}
    for action in ACTIONS:
        url, data = f"{ui}/api/v1/{action}", json.dumps(body[action]).encode()
        same = {**basic(), "X-Sparkctl-Token": session, "Content-Type": "application/json"}
        for headers in ({**same, "Origin": "http://evil.example"}, {**same, "Origin": "null"},
                        {**same, "Origin": "http://127.0.0.1:1"},  # another port of the same host
                        {**same, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-site"},
                        {k: v for k, v in same.items() if k != "X-Sparkctl-Token"} | {"Origin": f"http://{host}"},
                        {**same, "X-Sparkctl-Token": "forged", "Origin": f"http://{host}"},
                        {**basic(), "Cookie": f"sparkctl_session={session}", "Origin": f"http://{host}",
                         "Content-Type": "application/json"}):  # the session as a cookie: not enough
            code, answer = fetch(url, method="POST", body=data, headers=headers)
            assert code == 403 and json.loads(answer)["error"]["code"] == "forbidden", (action, headers, answer)
    assert daemon.client.get("/v1/desired")["aliases"]["primary"] == A  # nothing moved
    for path in ("/api/v1/status", "/api/v1/desired", "/api/v1/history", "/app.js", "/app.css"):
        code, text = fetch(ui + path, headers=basic())
        assert code == 200 and HUB_TOKEN not in text, path
    events = streamed(ui + "/api/v1/events?since=0")  # every event since the daemon started
    assert "data: {" in events and HUB_TOKEN not in events
    log = streamed(ui + f"/api/v1/logs?stack={A}&tail=200")
    assert "Starting vLLM API server" in log and HUB_TOKEN not in log


def test_a_page_on_another_loopback_port_gets_nothing_to_act_with(daemon, browser, cli) -> None:
    """Browsers keep cookies apart by host, not by port: a local server on another port of
    127.0.0.1 that the logged-in owner's browser visits gets the browser's cookies for 127.0.0.1.
    It gets no session: its page can neither read the dashboard nor act through it, and its
    server, replaying whatever the browser sent it (with the API key, which local agents hold),
    and whatever the page hands it then, parks nothing."""
    received: list[dict[str, str]] = []
    gateway = daemon.gateway
    script = f"""<script>(async () => {{
      try {{ await (await fetch("{gateway}/ui/", {{credentials: "include"}})).text(); document.title = "read"; }}
      catch (e) {{ document.title = "unread"; }}
      await fetch("{gateway}/ui/api/v1/park", {{method: "POST", mode: "no-cors", credentials: "include",
        headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{stack: "{A}", how: "stop"}})}});
      document.title += " sent";
    }})();</script>"""

    class Foreign(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            received.append(dict(self.headers))
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(script.encode())

        def log_message(self, *_: object) -> None:
            pass

    foreign = ThreadingHTTPServer(("127.0.0.1", 0), Foreign)
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    try:
        page = browser.new_page(http_credentials={"username": "owner", "password": KEY})
        page.goto(gateway + login_path(cli))
        sync_api.expect(page.locator("#live")).to_contain_text("live", timeout=10_000)
        assert page.evaluate("localStorage.getItem('sparkctl-session')")  # the owner is logged in
        page.goto(f"http://127.0.0.1:{foreign.server_address[1]}/ui/")  # under /ui: the cookie's path
        sync_api.expect(page).to_have_title("unread sent", timeout=20_000)
    finally:
        foreign.shutdown()
    assert received
    host = gateway.removeprefix("http://")
    for headers in received:
        cookie = {"Cookie": headers["Cookie"]} if "Cookie" in headers else {}
        _, html = fetch(gateway + "/ui/", headers={**basic(), **cookie})
        handed = re.findall(r'content="([0-9a-f.A-Za-z_-]{20,})"', html)  # whatever token the page may carry
        sessions = [c.partition("=")[2] for c in cookie.get("Cookie", "").split("; ")]
        for token in [*handed, *filter(None, sessions), ""]:
            code, answer = fetch(gateway + "/ui/api/v1/park", method="POST",
                                 body=json.dumps({"stack": A, "how": "stop"}).encode(),
                                 headers={**basic(), **cookie, "Origin": f"http://{host}",
                                          "Content-Type": "application/json", "X-Sparkctl-Token": token})
            assert code == 403, answer
    assert daemon.client.get("/v1/desired")["parked"] == {}


def test_log_follows_hold_no_worker_thread_and_end_when_their_clients_leave(daemon) -> None:
    """More log follows of a real engine than the daemon has worker threads (32), without a login:
    through the dashboard up to a client's cap (then 429), straight on the API's socket up to the
    daemon's cap (then 503). Meanwhile and after, status and an action answer at once; once the
    clients leave, though the engine logs nothing new, the follows end and the daemon's threads
    are as many as before."""
    from sparkctl.cli.client import UnixHTTP
    from sparkctl.daemon.api.queries import KEEPALIVE
    from sparkctl.daemon.api.service import MAX_FOLLOWS
    from sparkctl.gateway.ui import FOLLOWS_PER_CLIENT

    sock = daemon.state_dir / "sparkctl.sock"

    def answered_at_once() -> None:
        started = time.monotonic()
        with UnixHTTP(sock, 30).request("GET", "/v1/status") as reply:
            assert reply.status == 200 and json.loads(reply.read())["stacks"]
        with UnixHTTP(sock, 30).request("POST", "/v1/down", {"stack": B}) as reply:  # B is not up: a no-op
            assert reply.status == 200 and json.loads(list(reply.lines())[-1])["ok"]
        assert time.monotonic() - started < 10  # a loaded 2-core machine; hung, they time out at 30 s

    answered_at_once()
    baseline, files = threads(daemon.proc.pid), open_files(daemon.proc.pid)
    host = daemon.gateway.removeprefix("http://")
    opened = []
    for _ in range(FOLLOWS_PER_CLIENT):
        conn = http.client.HTTPConnection(host, timeout=30)
        conn.request("GET", f"/ui/api/v1/logs?stack={A}&tail=1", headers=basic())
        assert conn.getresponse().status == 200
        opened.append(conn)
    status, answer = fetch(f"{daemon.gateway}/ui/api/v1/logs?stack={A}", headers=basic())
    assert status == 429 and json.loads(answer)["error"]["code"] == "too_many_follows"
    for _ in range(MAX_FOLLOWS - FOLLOWS_PER_CLIENT):
        opened.append(UnixHTTP(sock, 30).request("GET", f"/v1/logs?stack={A}&tail=1"))
        assert opened[-1].status == 200
    with UnixHTTP(sock, 30).request("GET", f"/v1/logs?stack={A}&tail=1") as reply:
        assert reply.status == 503, reply.read()
    answered_at_once()
    assert threads(daemon.proc.pid) <= baseline + 2
    cli_follow = subprocess.Popen([sys.executable, "-m", "sparkctl", "logs", "-f", A, "-n", "3"], text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # Docker's, not the daemon's
    try:
        assert cli_follow.stdout.readline().strip(), cli_follow.stderr.read()
    finally:
        cli_follow.terminate()
        cli_follow.wait(30)
    for held in opened:
        (held.close if isinstance(held, http.client.HTTPConnection) else held.sock.close)()
    # each follow holds the client's socket and one to Docker: they close without a new log line
    wait_for(lambda: open_files(daemon.proc.pid) <= files + 2, timeout=30, logs=daemon.logs,
             what=f"the follows ended after their clients left ({open_files(daemon.proc.pid)} files, {files} before)")
    answered_at_once()
    assert threads(daemon.proc.pid) <= baseline + 2
    time.sleep(KEEPALIVE + 1)  # no event says the daemon let go of a follow: by then, each has
    again = [UnixHTTP(sock, 30).request("GET", f"/v1/logs?stack={A}&tail=1") for _ in range(MAX_FOLLOWS)]
    for reply in again:
        reply.sock.close()
    assert [reply.status for reply in again] == [200] * MAX_FOLLOWS  # every place was given back


def threads(pid: int) -> int:
    return int(re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(), re.M).group(1))


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_used_login_url_is_refused_after_the_daemon_restarts(start_daemon, cli) -> None:
    """A restarted daemon has forgotten which codes were used: it refuses every code made before
    it started, so a used login URL does not open a session again within its 5 minutes."""
    gateway = f"127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"

    def log_in(path: str) -> int:
        conn = http.client.HTTPConnection(gateway, timeout=30)
        conn.request("GET", path)
        status = conn.getresponse().status
        conn.close()
        return status

    first = start_daemon()
    used = login_path(cli)
    assert log_in(used) == 303 and log_in(used) == 403
    first.stop()
    start_daemon()
    assert log_in(used) == 403
    assert log_in(login_path(cli)) == 303  # a URL made now works


@pytest.mark.timeout(300)
def test_bench_run_p_quality_stores_a_quality_run_that_the_dashboard_shows(daemon, browser, cli, world) -> None:
    """`sparkctl bench run STACK -p quality` through the real CLI and daemon: lm-eval asks the
    sim through the keyed gateway, the run is stored and judged, the CLI prints its accuracy, and
    the stacks table shows each stack's last quality result."""
    amend(world / "stacks" / f"{A}.yaml", expectations={"quality": {"floor": 0.7, "items": 50}})
    code, out, err = cli("bench", "run", A, "-p", "quality")
    assert code == 0, err
    run = Store(world / "state" / "sparkctl.db").quality.runs(A)[0]
    assert run.verdict == "pass" and run.items == 50 and 0.8 <= run.accuracy <= 1.0
    assert f"quality run {run.id} of {A}: pass" in " ".join(out.split())
    assert f"{A}: sparkctl_arith {run.accuracy * 100:.1f}% (95% CI " in out
    page = browser.new_page(http_credentials={"username": "owner", "password": KEY})
    page.goto(daemon.gateway + login_path(cli))
    shown = page.locator(f'#stacks tr[data-stack="{A}"] .quality')
    sync_api.expect(shown).to_have_text(f"quality: {run.summary()}: pass", timeout=20_000)
    sync_api.expect(page.locator(f'#stacks tr[data-stack="{A}"] .quality.bad')).to_have_count(0)
