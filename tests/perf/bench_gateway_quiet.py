"""The gateway's own cost at one request at a time, against a quiet engine that answers at once.

`bench_gateway.py` measures against the simulated engine at a real model's speed, where the
engine's own time to first token varies by milliseconds from request to request: at
concurrency 1 its few dozen samples cannot resolve the 1 ms goal. Here the engine is a few lines
of asyncio that answer a streamed completion the moment the request is in, so what a proxy adds
shows to the microsecond. One keep-alive connection per target sends 1,000 requests one after
another (the first 50 warm up); three rounds, targets taking turns. Printed: time to the first
piece of the answer, direct and through sparkctl's gateway and nginx, and what each proxy adds
(p50 / p99), beside a control that measures the direct path again in its own turn (its "added"
figures are the method's noise). Goal, as in bench_gateway: p50 ≤ 1 ms, p99 ≤ 5 ms added.

Run with `make perf` (or `.venv/bin/python tests/perf/bench_gateway_quiet.py`).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench_gateway import NGINX_CONF, start  # noqa: E402
from world import figure, load, runs  # noqa: E402

from tests.conftest import free_port  # noqa: E402
from tests.teardown import stop  # noqa: E402

REQUESTS, WARM, ROUNDS = runs(1000, smoke=50), runs(50, smoke=5), runs(3)
PIECE = b'data: {"choices":[{"text":"x","index":0}]}\n\n'
ANSWER = PIECE * 4 + b"data: [DONE]\n\n"
GRAIN_MS = 0.1  # how much faster than the direct path's fastest answer a proxied one may still be: timer noise


async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers `/health` and streams a short completion at once, over keep-alive."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length")), 0)
            await reader.readexactly(length)
            if head.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"%x\r\n%s\r\n0\r\n\r\n" % (len(ANSWER), ANSWER))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def first_pieces(port: int, model: str) -> list[float]:
    """Microseconds to the first piece of each answer, on one keep-alive connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b'{"model":"%s","prompt":"hi","max_tokens":4,"stream":true}' % model.encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    times = []
    for _ in range(REQUESTS):
        sent = time.perf_counter()
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"\r\n")  # the first chunk's size line: the answer has begun
        times.append((time.perf_counter() - sent) * 1e6)
        await reader.readuntil(b"0\r\n\r\n")
    writer.close()
    return times[WARM:]


def serve_engine(port: int) -> None:
    async def main() -> None:
        server = await asyncio.start_server(engine, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


def main() -> None:
    print(load())
    if not shutil.which("nginx"):
        raise SystemExit("nginx is missing: `make perf` installs it (scripts/perf-setup.sh)")
    root = Path(tempfile.mkdtemp(prefix="sparkctl-gwq-"))
    ports = {name: free_port() for name in ("engine", "sparkctl", "nginx")}
    upstream = f"http://127.0.0.1:{ports['engine']}"
    procs = [start([sys.executable, __file__, "--serve-engine", str(ports["engine"])], upstream + "/health"),
             start([sys.executable, str(Path(__file__).parent / "bench_gateway.py"), "--serve-gateway",
                    str(ports["sparkctl"]), upstream], f"http://127.0.0.1:{ports['sparkctl']}/health")]
    for d in ("body", "proxy", "fcgi", "uwsgi", "scgi"):
        (root / d).mkdir()
    (root / "nginx.conf").write_text(NGINX_CONF.format(root=root, upstream=ports["engine"], port=ports["nginx"]))
    procs.append(start(["nginx", "-c", str(root / "nginx.conf"), "-p", str(root), "-g", "daemon off;"],
                       f"http://127.0.0.1:{ports['nginx']}/health"))
    targets = {"direct": (ports["engine"], "tiny"), "sparkctl": (ports["sparkctl"], "primary"),
               "nginx": (ports["nginx"], "tiny"), "control": (ports["engine"], "tiny")}
    try:
        times: dict[str, list[float]] = {name: [] for name in targets}
        names = list(targets)
        for turn in range(ROUNDS):
            for name in names[turn:] + names[:turn]:
                times[name] += asyncio.run(first_pieces(*targets[name]))
        report(times)
    finally:
        for proc in procs:
            stop(proc, 10)
        shutil.rmtree(root, ignore_errors=True)


def report(times: dict[str, list[float]]) -> None:
    def p(name: str, q: int) -> float:
        return statistics.quantiles(times[name], n=100)[q - 1]

    print(f"proxy cost at concurrency 1, quiet engine (answers at once), {len(times['direct'])} requests per target")
    print(f"direct: first piece after p50 {p('direct', 50):.0f} us, p99 {p('direct', 99):.0f} us")
    for name in ("sparkctl", "nginx", "control"):
        p50, p99 = (p(name, 50) - p("direct", 50)) / 1000, (p(name, 99) - p("direct", 99)) / 1000
        verdict = ("ok" if p50 <= 1 and p99 <= 5 else "MISSED") + " (goals: p50 <= 1 ms, p99 <= 5 ms)" \
            if name == "sparkctl" else {"nginx": "(reference)", "control": "(direct again: the noise)"}[name]
        print(f"{name:>9} adds p50 {p50:.3f} ms, p99 {p99:.3f} ms  {verdict}")
    # A proxy cannot answer before the engine: its percentile lies below the direct one only by noise,
    # never below the fastest answer the direct path gave (direct or control) less GRAIN_MS.
    fastest = min(times["direct"] + times["control"])
    for q in (50, 99):
        figure(f"direct first piece p{q}", p("direct", q), "us", sane=(1, 10**6))
        noise = (p("direct", q) - fastest) / 1000 + GRAIN_MS
        for name in ("sparkctl", "nginx", "control"):
            figure(f"{name} adds p{q}", (p(name, q) - p("direct", q)) / 1000, "ms", sane=(-noise, 1_000),
                   control=None if name == "control" else f"control adds p{q}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve-engine"]:
        serve_engine(int(sys.argv[2]))
    else:
        main()
