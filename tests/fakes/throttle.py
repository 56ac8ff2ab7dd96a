"""A link of a set bandwidth on loopback: a process of TCP proxies, one per server behind it, whose
answers all flow through one token bucket. A registry or a Hub behind a `Link` is a server behind a
link of that rate, for benchmarks that must not measure loopback's speed; a registry and a Hub
behind one `Link` share it. Only the server-to-client direction is limited: what a first `up` waits
for is what it downloads.

A process of its own, as a link is a machine of its own: proxies run inside a test's or a
benchmark's process would take their turns at its interpreter lock with whatever else it serves
(the sim Hub), and one server's link would slow another's.

Run as `python -m tests.fakes.throttle RATE TARGET...` from the repository's root: it prints the
`host:port` of each target's proxy on one line, then serves until SIGTERM.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import time
from pathlib import Path

from tests.teardown import stop

ROOT = Path(__file__).resolve().parents[2]


class Link:
    """`hosts[i]` ("127.0.0.1:port") forwards to `targets[i]` ("host:port"); all answer through one
    bucket of `rate` bytes/s."""

    def __init__(self, rate: float, *targets: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.throttle", str(rate), *targets], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            stop(self.proc)
            raise RuntimeError(f"the link to {', '.join(targets)} did not start (exit {self.proc.returncode})")
        self.hosts = line.split()

    @property
    def host(self) -> str:
        """The proxy of a link with one server behind it."""
        (host,) = self.hosts
        return host

    def stop(self) -> None:
        stop(self.proc)


class Bucket:
    """A token bucket of `rate` bytes/s, shared by every connection that takes from it."""

    def __init__(self, rate: float, *, burst: float = 256 * 1024) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, time.monotonic()

    def delay(self, n: int) -> float:
        """Take `n` bytes; how long the taker must wait before sending them."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate) - n
        self.at = now
        return max(0.0, -self.tokens / self.rate)


async def _serve(rate: float, targets: list[str]) -> None:
    bucket = Bucket(rate)
    servers = [await asyncio.start_server(functools.partial(_forward, t, bucket), "127.0.0.1", 0) for t in targets]
    print(" ".join(f"127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers), flush=True)
    await asyncio.Event().wait()  # until SIGTERM ends the process


async def _forward(target: str, bucket: Bucket, client_in: asyncio.StreamReader,
                   client_out: asyncio.StreamWriter) -> None:
    host, port = target.rsplit(":", 1)
    try:
        server_in, server_out = await asyncio.open_connection(host, int(port))
    except OSError:
        client_out.close()
        return
    await asyncio.gather(_pipe(client_in, server_out, None), _pipe(server_in, client_out, bucket))


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter, bucket: Bucket | None) -> None:
    try:
        while data := await source.read(64 * 1024):
            if bucket and (wait := bucket.delay(len(data))):
                await asyncio.sleep(wait)
            sink.write(data)
            await sink.drain()
    except OSError:
        pass
    finally:
        sink.close()


if __name__ == "__main__":
    asyncio.run(_serve(float(sys.argv[1]), sys.argv[2:]))
