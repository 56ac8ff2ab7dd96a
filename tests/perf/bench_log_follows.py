"""Log follows against a real daemon with a sim stack running (issue 45, item 2): what many open
follows of the engine's log cost the daemon, and whether it keeps answering meanwhile.

Without a login, a client opens follows of `/ui/api/v1/logs` through the gateway (40, then 100)
and, in the second round, as many straight on the API's socket as well (a local process of the
owner's, the CLI's `logs -f`): the dashboard keeps 4 per client address (429 beyond), the daemon
32 in all (503 beyond). Before, during each round and after the clients left (the engine logging
nothing new meanwhile): the daemon's resident memory, threads and open files, and throughout, the
worst `GET /v1/status` latency on the API's socket (what `sparkctl status` waits for), probed
every 0.2 s. Between rounds, the follows get the daemon's keep-alive interval (5 s) to end.

Goals (issue 45): status within 1 s throughout; memory back within 10 % of its start after the
clients leave; threads back to their start. Run with `make perf` (or
`.venv/bin/python tests/perf/bench_log_follows.py`).
"""

from __future__ import annotations

import http.client
import os
import socket
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SMOKE, daemon, figure, load, sparkctl, spread, world  # noqa: E402

from sparkctl.daemon.api.queries import KEEPALIVE  # noqa: E402

STACK = "qwen36-dflash"
ROUNDS = (40,) if SMOKE else (40, 100)
HOLD_S = 2.0 if SMOKE else 10.0  # how long each round's follows stay open


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def footprint(pid: int) -> tuple[float, int, int]:
    """Resident memory (MB), threads, open files."""
    return proc_status(pid, "VmRSS") / 1024, proc_status(pid, "Threads"), len(os.listdir(f"/proc/{pid}/fd"))


class Prober(threading.Thread):
    """`GET /v1/status` on the API's socket every 0.2 s; each answer's latency (a hung one counts
    at its 30 s timeout)."""

    def __init__(self, sock: Path) -> None:
        super().__init__(daemon=True)
        self.sock, self.took, self.stopped = sock, [], threading.Event()

    def run(self) -> None:
        from sparkctl.cli.client import UnixHTTP

        while not self.stopped.wait(0.2):
            began = time.perf_counter()
            try:
                with UnixHTTP(self.sock, 30).request("GET", "/v1/status") as reply:
                    reply.read()
            except OSError:
                pass
            self.took.append(time.perf_counter() - began)


def through_gateway(address: tuple[str, int], stack: str) -> tuple[socket.socket, int]:
    """A follow of `/ui/api/v1/logs` opened with no login; its socket and status."""
    conn = socket.create_connection(address, timeout=30)
    conn.sendall(f"GET /ui/api/v1/logs?stack={stack}&tail=1 HTTP/1.1\r\nHost: 127.0.0.1:{address[1]}\r\n"
                 "Accept: text/event-stream\r\n\r\n".encode())
    return conn, _status(conn)


def on_socket(sock: Path, stack: str) -> tuple[socket.socket, int]:
    """A follow of `/v1/logs` opened on the API's own socket; its socket and status."""
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(30)
    conn.connect(str(sock))
    conn.sendall(f"GET /v1/logs?stack={stack}&tail=1 HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    return conn, _status(conn)


def _status(conn: socket.socket) -> int:
    head = b""
    while b"\r\n" not in head:
        piece = conn.recv(4096)
        if not piece:
            return 0
        head += piece
    return int(head.split(b" ", 2)[1])


def main() -> None:
    print(load())
    with world() as (env, _):
        with daemon(env) as proc:
            sparkctl(env, "up", STACK)
            sock = Path(env["SPARKCTL_STATE_DIR"]) / "sparkctl.sock"
            gateway = ("127.0.0.1", int(env["SPARKCTL_GATEWAY_PORT"]))
            warm = http.client.HTTPConnection(*gateway, timeout=30)  # the dashboard's own first read
            warm.request("GET", "/ui/api/v1/status")
            warm.getresponse().read()
            warm.close()
            time.sleep(1)
            start = footprint(proc.pid)
            prober = Prober(sock)
            prober.start()
            print(f"before: {start[0]:.1f} MB resident, {start[1]} threads, {start[2]} files open")
            figure("daemon memory before", start[0], "MB", sane=(10, 4000))
            figure("daemon threads before", start[1], "threads", sane=(1, 500))
            for clients in ROUNDS:
                opened = [through_gateway(gateway, STACK) for _ in range(clients)]
                if clients > ROUNDS[0]:  # and as many on the API's socket
                    opened += [on_socket(sock, STACK) for _ in range(clients)]
                served = sum(status == 200 for _, status in opened)
                refused = {code: sum(status == code for _, status in opened) for code in (429, 503)}
                time.sleep(HOLD_S)
                during = footprint(proc.pid)
                both = " and as many on the socket" if clients > ROUNDS[0] else ""
                print(f"{clients} follows through the gateway{both}: {served} served, {refused[429]} answered 429, "
                      f"{refused[503]} answered 503; "
                      f"{during[0]:.1f} MB, {during[1]} threads, {during[2]} files open")
                figure(f"daemon memory during {clients} follows", during[0], "MB", sane=(10, 4000))
                figure(f"daemon threads during {clients} follows", during[1], "threads", sane=(1, 500))
                figure(f"follows served of {clients}", served, "follows", sane=(1, 2 * clients))
                for conn, _ in opened:
                    conn.close()
                time.sleep(KEEPALIVE + 1)  # a follow whose client left ends at its next line or keep-alive
            time.sleep(1)
            prober.stopped.set()
            prober.join(35)
            after = footprint(proc.pid)
            print(f"after: {after[0]:.1f} MB ({after[0] / start[0] - 1:+.1%}), {after[1]} threads, "
                  f"{after[2]} files open")
            print(f"status latency throughout: {spread(prober.took, scale=1000, unit='ms')} (goal <= 1000 ms)")
            figure("daemon memory after", after[0], "MB", sane=(10, 4000))
            figure("daemon memory after / before", after[0] / start[0], "x", sane=(0.5, 3))
            figure("daemon threads after", after[1], "threads", sane=(1, 500))
            figure("worst status latency", max(prober.took) * 1000, "ms", sane=(0.1, 31_000))


if __name__ == "__main__":
    main()
