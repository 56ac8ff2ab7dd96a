"""A fleet host's engine relay flooded from the LAN (issue 45, item 5): what the relay's process
costs while a machine on the network keeps N connections open without the fleet's credential,
and how long the head's credentialed probe takes meanwhile.

The relay runs as a host agent runs it (`Relays` with the settings' bounds), in a process of its
own at the file limit where the audit starved it (256), relaying a few-line engine on loopback.
The flood comes from 127.0.0.2 (another machine): it opens connections as fast as it can and
opens a new one for each the relay closes, keeping N open from its side, for the run's length.
The head, from 127.0.0.1, probes `/health` with the credential every 50 ms, on a new connection
(the hard case: each must get through the door) and on one keep-alive connection (the head's
gateway's pool: through the door once). Sampled every 0.2 s: the relay's RSS, open files
and threads. Printed: those before, at most during, and after the flood leaves; the probe's p50,
p99 and max latency and its failures; the bytes the relay logged.

Run with `.venv/bin/python tests/perf/bench_relay_flood.py` (smoke: SPARKCTL_PERF_SMOKE=1).
"""

from __future__ import annotations

import http.client
import os
import resource
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from world import figure, load, runs  # noqa: E402

from tests.fakes import relayprocess  # noqa: E402
from tests.teardown import stop  # noqa: E402

KEY = "bench-relay-key"
HEAD, LAN = "127.0.0.1", "127.0.0.2"
FLOOD, SECONDS = runs(2000, smoke=305), runs(20, smoke=3)
PROBE_EVERY = 0.05
def main() -> None:
    print(load())
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, FLOOD + 512)), hard))  # the flood's own files
    root = Path(tempfile.mkdtemp(prefix="sparkctl-relay-flood-"))
    port, out = _free_port(), root / "relay.log"
    relay = relayprocess.start(port, KEY, log=out, state_dir=root / "s")
    try:
        before = _sample(relay.pid)
        samples: list[dict[str, float]] = []
        probes: dict[str, list[float | None]] = {"new connection": [], "keep-alive": []}
        kept = _Kept(port)
        flooder = subprocess.Popen([sys.executable, __file__, "--flood", str(port)], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        ends = time.monotonic() + SECONDS
        next_sample = 0.0
        while time.monotonic() < ends:
            probes["new connection"].append(_probe(port))
            probes["keep-alive"].append(kept.probe())
            if time.monotonic() >= next_sample:
                samples.append(_sample(relay.pid))
                next_sample = time.monotonic() + 0.2
            time.sleep(PROBE_EVERY)
        opened = int(flooder.communicate(timeout=60)[0].strip() or 0)  # its stdin closed: it stops
        time.sleep(1.0)  # the relay sees the flood's connections close
        after = _sample(relay.pid)
        report(before, samples, after, probes, opened, out.stat().st_size)
    finally:
        stop(relay, 10)


def report(before: dict[str, float], samples: list[dict[str, float]], after: dict[str, float],
           probes: dict[str, list[float | None]], opened: int, logged: int) -> None:
    peak = {k: max(s[k] for s in samples) for k in before}
    print(f"{FLOOD} idle connections held open from {LAN} for {SECONDS} s ({opened} opened in all); "
          f"the relay at a 256-file limit")
    for name, unit in (("rss_mib", "MiB"), ("files", ""), ("threads", "")):
        print(f"relay {name}: before {before[name]:.1f}, at most {peak[name]:.1f} during, "
              f"after {after[name]:.1f} {unit}")
    for way, sent in probes.items():
        answered = sorted(p for p in sent if p is not None)
        failed = len(sent) - len(answered)
        p50, p99 = statistics.median(answered), answered[min(len(answered) - 1, int(len(answered) * 0.99))]
        print(f"head's probe ({way}, credential): {len(sent)} sent, {failed} failed; "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {answered[-1]:.1f} ms")
        figure(f"head probe p50 during flood, {way}", p50, "ms", sane=(0.01, 1000))
        figure(f"head probe p99 during flood, {way}", p99, "ms", sane=(0.01, 5000))
        figure(f"head probes failed during flood, {way}", failed, "probes", sane=(-1, 1))
    print(f"relay's log: {logged} bytes")
    figure("relay rss before", before["rss_mib"], "MiB", sane=(5, 500))
    figure("relay rss during flood", peak["rss_mib"], "MiB", sane=(5, 1000))
    figure("relay rss after flood", after["rss_mib"], "MiB", sane=(5, 1000))
    figure("relay files during flood", peak["files"], "files", sane=(1, 256))
    figure("relay threads during flood", peak["threads"], "threads", sane=(1, 200))
    figure("relay log bytes", logged, "bytes", sane=(-1, 65536))


def flood(port: int) -> None:
    """Keep FLOOD connections open from LAN, each idle; open a new one for each the relay closes,
    until stdin ends; then print how many were opened. A process of its own, so the probe's timing
    is not the flood's turn at the interpreter. (The end of stdin, not a signal: a signal sent
    before a loaded machine has started this process would be lost or kill it.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, FLOOD + 512)), hard))
    sel, opened = selectors.DefaultSelector(), 0
    sel.register(sys.stdin, selectors.EVENT_READ, "stop")
    while True:
        while len(sel.get_map()) <= FLOOD:
            conn = socket.socket()
            conn.bind((LAN, 0))
            conn.setblocking(False)
            try:
                conn.connect((HEAD, port))
            except BlockingIOError:
                pass
            sel.register(conn, selectors.EVENT_READ)
            opened += 1
        ready = sel.select(0.05)
        if any(key.data == "stop" for key, _ in ready):
            break
        for key, _ in ready:
            try:
                gone = key.fileobj.recv(1) == b""
            except (BlockingIOError, InterruptedError):
                gone = False
            except OSError:
                gone = True
            if gone:
                sel.unregister(key.fileobj)
                key.fileobj.close()
    print(opened, flush=True)


def _probe(port: int) -> float | None:
    """The head's credentialed `/health` on a new connection: ms to its answer (None: none in 5 s)."""
    return _Kept(port).probe(close=True)


class _Kept:
    """The head's gateway's way: one keep-alive connection, credentialed once through the door."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection(HEAD, port, timeout=5, source_address=(HEAD, 0))

    def probe(self, *, close: bool = False) -> float | None:
        started = time.perf_counter()
        try:
            self.conn.request("GET", "/health", headers={"Authorization": f"Bearer {KEY}"})
            with self.conn.getresponse() as answer:
                answer.read()
                if answer.status != 200:
                    return None
        except OSError:
            self.conn.close()  # the next probe opens a new one
            return None
        finally:
            if close:
                self.conn.close()
        return (time.perf_counter() - started) * 1000


def _sample(pid: int) -> dict[str, float]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {"rss_mib": int(status["VmRSS"].split()[0]) / 1024, "threads": int(status["Threads"]),
            "files": len(os.listdir(f"/proc/{pid}/fd"))}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HEAD, 0))
        return probe.getsockname()[1]


if __name__ == "__main__":
    if sys.argv[1:2] == ["--flood"]:
        flood(int(sys.argv[2]))
    else:
        main()
