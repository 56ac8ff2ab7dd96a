"""Gateway figures: what the sparkctl gateway adds to a streamed response, beside a direct
connection to the same simulated engine and beside nginx (Debian's, configured as a streaming
reverse proxy: proxy_buffering off, keep-alive upstream) as the reference proxy.

256-token streamed completions at concurrency 1, 16 and 64: that many clients, each sending its
requests back to back, started spread over one response time so their requests arrive out of
step, as independent agents' do; only requests sent once every client runs are measured. The
engine runs at the Gemma profile's measured speed and is warmed at each level first. The targets
take turns in rounds, each target first in one of them, so drift and order hit them alike.
Printed per concurrency: added time to first token (p50 and p99, against direct) and decode
tok/s as a ratio to direct. Goals: p50 ≤ 1 ms, p99 ≤ 5 ms, ratio ≥ 0.97. Two more targets
calibrate the figures: a control measures the direct connection again in its own turn (its
"added" figures are the method's noise on this machine), and a bare Python byte forwarder
(asyncio, no HTTP parsing) shows what any Python process in the path costs. Also printed, not
judged: a cold burst, every client sending one request in the same millisecond. The gateway and
nginx each run as one process (nginx: one worker).

Run with `make perf` (or `.venv/bin/python tests/perf/bench_gateway.py`; `BENCH_GATEWAY_LEVELS=1`
for one level).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from sparkctl.deploy.health import http_status  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.fakes.tinymodel import write_model  # noqa: E402
from tests.teardown import stop  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SMOKE, figure, load, runs  # noqa: E402

TOKENS, ROUNDS = 256, runs(5)
REQUESTS = {1: 2, 16: 1} if SMOKE else {1: 6, 16: 2, 64: 2}  # concurrency -> requests per client per round
# BENCH_GATEWAY_LEVELS=1 (say) measures only those levels.
LEVELS = [int(c) for c in os.environ.get("BENCH_GATEWAY_LEVELS", ",".join(map(str, REQUESTS))).split(",")]
SCALE = "1"  # the no-spec Gemma profile as seed 003 measured it: 81 tok/s per stream
RESPONSE_S = TOKENS / 81  # one response's time at that speed
Row = tuple[float, float]  # (TTFT in s, decode tok/s) of one request
NGINX_CONF = """
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {root}/body; proxy_temp_path {root}/proxy; fastcgi_temp_path {root}/fcgi;
  uwsgi_temp_path {root}/uwsgi; scgi_temp_path {root}/scgi;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


def serve_gateway(port: int, upstream: str) -> None:
    """The sparkctl gateway alone, routing `primary` to the engine (run as its own process)."""
    from sparkctl.gateway.proxy import Gateway
    from sparkctl.gateway.routes import RouteTable, Upstream

    table = RouteTable(upstreams={"gemma": Upstream("gemma", upstream, "tiny")}, aliases={"primary": "gemma"})

    async def main() -> None:
        server = await Gateway(lambda: table).serve("127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


class _Pipe(asyncio.Protocol):
    """One side of the byte forwarder: what arrives is written to the other side as it is."""

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        self.upstream, self.peer, self.transport = upstream, None, None

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.upstream:  # the client's side: connect to the engine before reading
            transport.pause_reading()
            asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        _, self.peer = await asyncio.get_running_loop().create_connection(lambda: _Pipe(), *self.upstream)
        self.peer.peer = self
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.peer.transport.write(data)

    def connection_lost(self, exc) -> None:
        if self.peer is not None:
            self.peer.transport.close()


def serve_forwarder(port: int, upstream: str) -> None:
    """The floor of any Python proxy: bytes forwarded both ways, no HTTP at all."""
    async def main() -> None:
        address = ("127.0.0.1", int(upstream.rsplit(":", 1)[1]))
        server = await asyncio.get_running_loop().create_server(lambda: _Pipe(address), "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


STARTS_WITHIN = 120  # s: a Python server's imports alone take seconds with two test tiers beside it


def start(command: list[str], url: str, env: dict | None = None) -> subprocess.Popen:
    """`command`, once `url` answers; one that does not within STARTS_WITHIN is stopped, not left."""
    proc = subprocess.Popen(command, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTS_WITHIN
    while http_status(url) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc, 10)
            raise SystemExit(f"{command[0]} did not start within {STARTS_WITHIN} s ({url}; exit code "
                             f"{proc.returncode})")
        time.sleep(0.05)
    return proc


async def one(session: aiohttp.ClientSession, url: str, model: str, tokens: int = TOKENS) -> tuple[float, float]:
    """(time to first token in s, decode tok/s) of one streamed completion."""
    body = {"model": model, "prompt": "Write about the sea.", "max_tokens": tokens, "ignore_eos": True,
            "stream": True}
    sent = time.perf_counter()
    first = last = 0.0
    count = 0
    async with session.post(url + "/v1/completions", json=body) as response:
        async for line in response.content:  # a byte test, not a JSON parse: the client stays light
            if line.startswith(b"data: {") and b'"text":""' not in line:
                last = time.perf_counter()
                first = first or last
                count += 1
    assert count == tokens, f"{url}: {count} chunks"
    return first - sent, (count - 1) / (last - first) if count > 1 else 0.0


async def level(url: str, model: str, concurrency: int, requests: int, *, burst: bool = False) -> list[Row]:
    """(TTFT, decode tok/s) of each measured request. The clients start spread over one response
    time, so their requests arrive out of step, as independent agents' do, and only requests sent
    once every client is running count. With `burst`, each client sends one request, all in the
    same millisecond."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        # Warm every connection on the way (client -> proxy -> engine), as a long-running agent's are.
        await asyncio.gather(*(one(session, url, model, tokens=2) for _ in range(concurrency)))
        spread = 0.0 if burst else RESPONSE_S / concurrency
        start = time.perf_counter()

        async def client(index: int) -> list[Row]:
            await asyncio.sleep(index * spread)
            rows = []
            for _ in range(1 if burst else requests):
                running = time.perf_counter() - start >= spread * (concurrency - 1)
                row = await one(session, url, model)
                rows += [row] if running else []
            return rows

        return [r for rows in await asyncio.gather(*(client(i) for i in range(concurrency))) for r in rows]


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    print(load())
    if not shutil.which("nginx"):
        raise SystemExit("nginx is missing: `make perf` installs it (scripts/perf-setup.sh)")
    root = Path(tempfile.mkdtemp(prefix="sparkctl-gw-"))
    model = write_model(root / "model", weights=False)
    ports = {name: free_port() for name in ("engine", "sparkctl", "nginx", "forwarder")}
    engine = f"http://127.0.0.1:{ports['engine']}"
    procs = [start([sys.executable, "-m", "sparkctl.sim", "serve", str(model), "--served-model-name", "tiny",
                    "--port", str(ports["engine"]), "--max-model-len", "4096", "--sim-profile", "aeon-gemma4-nospec"],
                   engine + "/health", {"SPARKCTL_SIM_TIME_SCALE": SCALE, "SPARKCTL_SIM_LOAD_SCALE": "0"})]
    for mode, name in (("--serve-gateway", "sparkctl"), ("--serve-forwarder", "forwarder")):
        procs.append(start([sys.executable, __file__, mode, str(ports[name]), engine],
                           f"http://127.0.0.1:{ports[name]}/health"))
    for d in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
        (root / d).mkdir()
    (root / "nginx.conf").write_text(NGINX_CONF.format(root=root, upstream=ports["engine"], port=ports["nginx"]))
    procs.append(start(["nginx", "-c", str(root / "nginx.conf"), "-p", str(root), "-g", "daemon off;"],
                       f"http://127.0.0.1:{ports['nginx']}/health"))
    targets = {"direct": (engine, "tiny"), "sparkctl": (f"http://127.0.0.1:{ports['sparkctl']}", "primary"),
               "nginx": (f"http://127.0.0.1:{ports['nginx']}", "tiny"),
               "forwarder": (f"http://127.0.0.1:{ports['forwarder']}", "tiny"), "control": (engine, "tiny")}
    try:
        print(f"proxy overhead, {TOKENS}-token streamed completions, sim engine (Gemma profile x{1 / float(SCALE):g})")
        print(f"{'conc':>4} {'proxy':>9} {'added TTFT p50':>15} {'p99':>9} {'decode ratio':>13}  goals: p50 <= 1 ms, "
              "p99 <= 5 ms, ratio >= 0.97")
        for concurrency in LEVELS:
            requests = REQUESTS[concurrency]
            results: dict[str, list[Row]] = {name: [] for name in targets}
            bursts: dict[str, list[Row]] = {name: [] for name in targets}
            asyncio.run(level(engine, "tiny", concurrency, 1))  # warms the engine at this load, not measured
            names = list(targets)
            for turn in range(ROUNDS):  # each target first in one round
                for name in names[turn:] + names[:turn]:
                    results[name] += asyncio.run(level(*targets[name], concurrency, requests))
                    if concurrency > 1:
                        bursts[name] += asyncio.run(level(*targets[name], concurrency, 1, burst=True))
            report(concurrency, results)
            if concurrency > 1:
                report(concurrency, bursts, burst=True)
    finally:
        for proc in procs:
            stop(proc, 10)
        shutil.rmtree(root, ignore_errors=True)


def report(concurrency: int, results: dict[str, list[Row]], burst: bool = False) -> None:
    ttft = {name: [r[0] * 1000 for r in rows] for name, rows in results.items()}
    decode = {name: statistics.mean(r[1] for r in rows) for name, rows in results.items()}
    for name in ("sparkctl", "nginx", "forwarder", "control"):
        p50 = pct(ttft[name], 50) - pct(ttft["direct"], 50)
        p99 = pct(ttft[name], 99) - pct(ttft["direct"], 99)
        ratio = decode[name] / decode["direct"]
        verdict = "ok" if p50 <= 1 and p99 <= 5 and ratio >= 0.97 else "MISSED"
        note = {"nginx": "(reference)", "forwarder": "(Python byte forwarder: the floor of a Python hop)",
                "control": "(direct again: the noise)"}.get(
            name, "(cold burst: every client at once)" if burst else verdict)
        print(f"{concurrency:>4} {name:>9} {p50:>12.2f} ms {p99:>6.2f} ms {ratio:>13.3f}  {note}")
    if not burst:
        print(f"{concurrency:>4} {'direct':>9}   TTFT p50 {pct(ttft['direct'], 50):.2f} ms, p99 "
              f"{pct(ttft['direct'], 99):.2f} ms, decode {decode['direct']:.0f} tok/s per stream, "
              f"{len(results['direct'])} requests per target")
    figures(f"conc {concurrency}{' burst' if burst else ''}", ttft, decode, ("sparkctl", "nginx", "forwarder"))
    sys.stdout.flush()


def figures(where: str, ttft: dict[str, list[float]], decode: dict[str, float], proxies: tuple[str, ...]) -> None:
    """The figures of one level as JSON lines (world.figure), each proxy's beside the control's (the
    direct path measured again). Sane for an added TTFT is anything that leaves a first token after
    the request: a proxy's percentile below the direct one is noise (the sides run seconds apart,
    and a smoke run on a loaded machine has few samples), which the control shows the size of.
    The engine paces 81 tok/s per stream."""
    for q in (50, 99):
        direct = pct(ttft["direct"], q)
        figure(f"{where} direct TTFT p{q}", direct, "ms", sane=(0.1, 60_000))
        for name in (*proxies, "control"):
            figure(f"{where} {name} added TTFT p{q}", pct(ttft[name], q) - direct, "ms", sane=(-direct, 2_000),
                   control=None if name == "control" else f"{where} control added TTFT p{q}")
    figure(f"{where} direct decode", decode["direct"], "tok/s", sane=(20, 330))
    for name in (*proxies, "control"):
        figure(f"{where} {name} decode ratio", decode[name] / decode["direct"], "x", sane=(0.5, 2),
               control=None if name == "control" else f"{where} control decode ratio")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-gateway"]:
        serve_gateway(int(sys.argv[2]), sys.argv[3])
    elif sys.argv[1:2] == ["--serve-forwarder"]:
        serve_forwarder(int(sys.argv[2]), sys.argv[3])
    else:
        main()
