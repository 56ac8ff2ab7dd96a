"""What attacks on an idle daemon cost it, and whether it still answers its owner (issue 45).

Each attack runs against a real daemon (its gateway on the world's port, no stack needed), one
after the other. For each, printed beside its goals:
- the daemon's memory (PSS and RSS, MB, from /proc) at the start, at its peak while the clients
  attack, and after they left (waiting up to AFTER_S for it to come back);
- its thread count at the same three points;
- the worst wall time of `sparkctl status`, run in a loop from the start of the attack until
  the memory is back.
Goals: memory back within 10 % of its start after the clients leave; `status` <= 1 s throughout.

The attacks (one function each, in ATTACKS):
- `pipelined_gets`: clients pipeline `GET /ui/app.js` (no credential) and never read;
- `pipelined_bodies`: clients open an answer that does not end (the dashboard's event stream)
  and pipeline 16 bodies of 32 MiB behind it.
To add one: write a context manager `def name(gateway: tuple[str, int]) -> Iterator[None]` that
starts its clients on entry, holds them while the `with` block runs (HOLD_S), and closes them on
exit (a client that leaves); append it to ATTACKS. Its figures are named after the function.

Run with `make perf` (or `.venv/bin/python tests/perf/bench_hardening.py`); smoke mode
(SPARKCTL_PERF_SMOKE=1) runs each attack small and short.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SMOKE, SPARKCTL, daemon, figure, load, world  # noqa: E402

MiB = 1 << 20
HOLD_S, AFTER_S = (3, 20) if SMOKE else (20, 60)  # s the clients attack; s the memory gets to come back
BACK = 1.10  # goal: memory after within 10 % of its start
STATUS_GOAL = 1.0  # s


# --- the attacks --------------------------------------------------------------------------------
@contextlib.contextmanager
def pipelined_gets(gateway: tuple[str, int]) -> Iterator[None]:
    """Clients that pipeline `GET /ui/app.js` (22 kB answers) and never read (issue 45, finding 1:
    1 MB of them took the daemon from 110 to 539 MB)."""
    clients, size = (1, 64 * 1024) if SMOKE else (8, MiB)
    request = b"GET /ui/app.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with flooding([(gateway, [request * (size // len(request))]) for _ in range(clients)]):
        yield


@contextlib.contextmanager
def pipelined_bodies(gateway: tuple[str, int]) -> Iterator[None]:
    """Clients that open an answer that does not end (the dashboard's event stream), then pipeline
    16 bodies of 32 MiB behind it (issue 45, finding 1: two of them took the daemon from 98 to
    1,139 MB, not released after close)."""
    clients, size = (2, MiB) if SMOKE else (2, 32 * MiB)
    stream = b"GET /ui/api/v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    body = b'{"model": "nope", "prompt": "' + b"a" * (size - 32) + b'"}'
    post = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" \
           b"Content-Length: %d\r\n\r\n" % len(body)
    with flooding([(gateway, [stream, *[post + body] * 16]) for _ in range(clients)]):
        yield


ATTACKS: list[Callable[[tuple[str, int]], contextlib.AbstractContextManager[None]]] = [
    pipelined_gets, pipelined_bodies]


# --- clients ------------------------------------------------------------------------------------
@contextlib.contextmanager
def flooding(clients: Iterable[tuple[tuple[str, int], list[bytes]]]) -> Iterator[None]:
    """One thread per client, each sending its pieces as fast as the server takes them and never
    reading (a small receive buffer, so the answers back up at the server); on exit each stops
    and closes its socket."""
    stop = threading.Event()
    threads = [threading.Thread(target=_flood, args=(address, pieces, stop), daemon=True)
               for address, pieces in clients]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


def _flood(address: tuple[str, int], pieces: list[bytes], stop: threading.Event) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(address)
    sock.settimeout(0.2)
    try:
        for piece in pieces:
            view = memoryview(piece)
            while view and not stop.is_set():
                try:
                    view = view[sock.send(view):]
                except TimeoutError:
                    continue
        stop.wait()
    except OSError:
        stop.wait()  # refused and closed by the server: the attack holds nothing more
    finally:
        sock.close()


# --- what is measured ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Reading:
    pss: float  # MB
    rss: float  # MB
    threads: int


def read(pid: int) -> Reading:
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    kb = {line.split(":")[0]: int(line.split()[1]) for line in rollup[1:] if line.split()[-1] == "kB"}
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    threads = next(int(line.split()[1]) for line in status if line.startswith("Threads:"))
    return Reading(kb["Pss"] / 1024, kb["Rss"] / 1024, threads)


class Watch:
    """While its `with` block runs: the daemon's peak reading (every 0.1 s), and the wall time of
    each `sparkctl status`, run one after the other."""

    def __init__(self, env: dict[str, str], pid: int) -> None:
        self.env, self.pid, self.done = env, pid, threading.Event()
        self.peak = read(pid)
        self.status: list[float] = []
        self.threads = [threading.Thread(target=self._sample, daemon=True),
                        threading.Thread(target=self._ask, daemon=True)]

    def __enter__(self) -> Watch:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        for thread in self.threads:
            thread.join(30)

    def _sample(self) -> None:
        while not self.done.wait(0.1):
            now = read(self.pid)
            self.peak = Reading(max(self.peak.pss, now.pss), max(self.peak.rss, now.rss),
                                max(self.peak.threads, now.threads))

    def _ask(self) -> None:
        while not self.done.is_set():
            started = time.monotonic()
            subprocess.run([SPARKCTL, "status"], env=self.env, capture_output=True, check=True, timeout=60)
            self.status.append(time.monotonic() - started)


def settled(pid: int) -> Reading:
    """The daemon's reading once its memory stops moving (within 2 % over 1 s, at most 20 s)."""
    before, deadline = read(pid), time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(1)
        now = read(pid)
        if abs(now.pss - before.pss) <= 0.02 * before.pss:
            return now
        before = now
    return before


def measure(env: dict[str, str], pid: int, attack: Callable, gateway: tuple[str, int]) -> None:
    name = attack.__name__
    start = settled(pid)
    with Watch(env, pid) as watch:
        with attack(gateway):
            time.sleep(HOLD_S)
        deadline = time.monotonic() + AFTER_S
        while (after := read(pid)).pss > start.pss * BACK and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(1)  # a status call or two once the memory is back
    after, worst = read(pid), max(watch.status)
    print(f"{name}: PSS {start.pss:.0f} -> peak {watch.peak.pss:.0f} -> after {after.pss:.0f} MB "
          f"(RSS {start.rss:.0f} -> {watch.peak.rss:.0f} -> {after.rss:.0f}); goal after <= {start.pss * BACK:.0f} MB "
          f"{'met' if after.pss <= start.pss * BACK else 'MISSED'}")
    print(f"{name}: threads {start.threads} -> peak {watch.peak.threads} -> after {after.threads}; "
          f"`sparkctl status` worst {worst:.3f} s (median {statistics.median(watch.status):.3f} s) over "
          f"{len(watch.status)} calls, goal <= {STATUS_GOAL:.1f} s "
          f"{'met' if worst <= STATUS_GOAL else 'MISSED'}")
    figure(f"{name}: memory after / start", after.pss / start.pss, "ratio", sane=(0.5, 20))
    figure(f"{name}: peak memory", watch.peak.pss, "MB", sane=(10, 8000))
    figure(f"{name}: peak threads", watch.peak.threads, "threads", sane=(1, 1000))
    figure(f"{name}: worst status", worst, "s", sane=(0.01, 120))


def main() -> None:
    print(load())
    with world() as (env, _hub), daemon(env) as proc:
        gateway = ("127.0.0.1", int(env["SPARKCTL_GATEWAY_PORT"]))
        for attack in ATTACKS:
            measure(env, proc.pid, attack, gateway)


if __name__ == "__main__":
    main()
