"""Dashboard figures against a real daemon with a sim stack running, in Debian's Chromium (through
Playwright), each beside its goal and its reference:

- the page's first load, cold (a new browser context each time: no cache, a new connection): the
  page, app.js and app.css from the daemon's gateway on loopback, to the load event, and the bytes
  they take; beside it, the same browser loading the gateway's plain /health (a new context's own
  cost, and the key's 401 challenge the browser answers first), and the daemon's part alone (the
  three files fetched on new connections without a browser);
- event latency: from a stack's phase change (the event's own time on the daemon's bus) to the page
  showing it, for each event of a `down` and an `up` of the stack;
- the daemon's CPU while idle with one page open, beside the same daemon with none, over equal
  windows (the page polls the gateway's counters every 2 s and holds the event stream).

Goals (issue 20): first load <= 100 ms and <= 300 KB; event latency <= 250 ms; idle CPU <= 1 %.
Run with `make perf` (or `.venv/bin/python tests/perf/bench_dashboard.py`).
"""

from __future__ import annotations

import base64
import os
import shutil
import statistics
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from playwright.sync_api import sync_playwright  # noqa: E402
from world import daemon, figure, load, runs, sparkctl, spread, world  # noqa: E402

LOADS, IDLE_S = runs(20, smoke=2), runs(30, smoke=3)
KEY = "sk-bench"
STACK = "qwen36-dflash"
# Each event the page shows: when it came to the page, against the event's own time on the bus.
WATCH = """() => { window.shown = [];
  new MutationObserver(() => { const live = document.getElementById("live");
    if (live.dataset.time) window.shown.push([Date.now(), Number(live.dataset.time) * 1000, live.textContent]); })
  .observe(document.getElementById("live"), {attributes: true, childList: true, subtree: true}); }"""


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu(pid: int, seconds: float) -> float:
    before, began = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - began) * 100


def first_loads(browser, url: str) -> tuple[list[float], list[int]]:
    took, sizes = [], []
    for _ in range(LOADS):
        context = browser.new_context(http_credentials={"username": "owner", "password": KEY})
        page = context.new_page()
        page.goto(url, wait_until="load")
        timing = page.evaluate("""() => { const nav = performance.getEntriesByType("navigation")[0];
            const assets = performance.getEntriesByType("resource").filter(r => /app\\.(js|css)$/.test(r.name));
            return [nav.loadEventStart - nav.startTime,
                    [nav, ...assets].reduce((sum, r) => sum + r.transferSize, 0)]; }""")
        took.append(timing[0] / 1000)
        sizes.append(int(timing[1]))
        context.close()
    return took, sizes


def served(gateway: str) -> tuple[list[float], int]:
    """The daemon's part of a first load: the page and its two assets, each on a new connection."""
    auth = {"Authorization": "Basic " + base64.b64encode(f"owner:{KEY}".encode()).decode()}
    took, size = [], 0
    for _ in range(LOADS):
        began, size = time.perf_counter(), 0
        for path in ("/ui", "/ui/app.js", "/ui/app.css"):
            with urllib.request.urlopen(urllib.request.Request(gateway + path, headers=auth), timeout=10) as reply:
                size += len(reply.read())
        took.append(time.perf_counter() - began)
    return took, size


def main() -> None:
    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("Debian's chromium is not installed (`make test` installs it)")
    print(load())
    with world() as (env, _):
        env = {**env, "SPARKCTL_GATEWAY_API_KEYS": KEY}
        with daemon(env) as proc, sync_playwright() as p:
            gateway = f"http://127.0.0.1:{env['SPARKCTL_GATEWAY_PORT']}"
            sparkctl(env, "up", STACK)
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
            fetched, size = served(gateway)
            print(f"first load from the daemon (page + app.js + app.css, new connections, no browser): "
                  f"{spread(fetched, scale=1000, unit='ms')}; {size / 1024:.1f} KB")
            figure("first load from the daemon, no browser", statistics.median(fetched) * 1000, "ms",
                   sane=(0.05, 60_000))
            figure("first load from the daemon, bytes", size / 1024, "KB", sane=(1, 10_000))
            took, sizes = first_loads(browser, gateway + "/ui")
            reference, _ = first_loads(browser, gateway + "/health")
            print(f"first load, cold (page + app.js + app.css to the load event): {spread(took, scale=1000, unit='ms')}"
                  f"; {max(sizes) / 1024:.1f} KB; beside /health alone {spread(reference, scale=1000, unit='ms')}; "
                  f"ratio {statistics.median(took) / statistics.median(reference):.2f} "
                  f"(goal <= 100 ms and <= 300 KB)")
            figure("first load, cold, in the browser", statistics.median(took) * 1000, "ms", sane=(1, 60_000))
            figure("first load, cold, bytes", max(sizes) / 1024, "KB", sane=(1, 10_000))
            figure("the browser's /health alone", statistics.median(reference) * 1000, "ms", sane=(1, 60_000))
            figure("first load / /health alone", statistics.median(took) / statistics.median(reference), "x",
                   sane=(0.2, 100))

            context = browser.new_context(http_credentials={"username": "owner", "password": KEY},
                                          bypass_csp=True)  # the measurement's own script runs in the page
            page = context.new_page()
            page.goto(gateway + "/ui", wait_until="load")
            page.wait_for_function("document.getElementById('live').textContent.startsWith('live')")
            page.evaluate(WATCH)
            sparkctl(env, "down", STACK)
            sparkctl(env, "up", STACK)
            time.sleep(0.5)
            shown = page.evaluate("window.shown")
            lags = [(at - sent) / 1000 for at, sent, _ in shown]
            print(f"event latency, bus to page, {len(lags)} events of a down and an up: "
                  f"{spread(lags, scale=1000, unit='ms')} (goal <= 250 ms)")
            # the page's clock (Date.now) has a millisecond's grain; the bus stamps the event first
            figure("event latency, bus to page", statistics.median(lags) * 1000, "ms", sane=(-1, 60_000))

            with_page = [idle_cpu(proc.pid, IDLE_S) for _ in range(2)]
            context.close()
            browser.close()
            time.sleep(2)
            without = [idle_cpu(proc.pid, IDLE_S) for _ in range(2)]
            print(f"daemon CPU, idle, one page open: {spread(with_page, unit='%', digits=2)}; no page: "
                  f"{spread(without, unit='%', digits=2)} (goal <= 1 %)")
            cores = 100 * (os.cpu_count() or 1)
            figure("daemon idle CPU, one page open", statistics.median(with_page), "%", sane=(0, cores))
            figure("daemon idle CPU, no page", statistics.median(without), "%", sane=(0, cores))


if __name__ == "__main__":
    main()
