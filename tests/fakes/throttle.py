"""A loopback TCP proxy whose answers flow at a set rate: a registry or a Hub behind a link of a
given bandwidth, for benchmarks that must not measure loopback's speed. Several proxies may share
one `Bucket` (one link for both servers). Only the server-to-client direction is limited: what a
first `up` waits for is what it downloads."""

from __future__ import annotations

import asyncio
import threading
import time


class Bucket:
    """A token bucket of `rate` bytes/s, shared by every connection that takes from it."""

    def __init__(self, rate: float, *, burst: float = 256 * 1024) -> None:
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, time.monotonic()
        self.lock = threading.Lock()

    def delay(self, n: int) -> float:
        """Take `n` bytes; how long the taker must wait before sending them."""
        with self.lock:
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate) - n
            self.at = now
            return max(0.0, -self.tokens / self.rate)


class Throttle:
    """`127.0.0.1:port` forwards to `target` ("host:port"), answers through `bucket`."""

    def __init__(self, target: str, bucket: Bucket) -> None:
        self.target, self.bucket = target, bucket
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        ready.wait(10)
        self.host = f"127.0.0.1:{self.port}"

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        host, port = self.target.rsplit(":", 1)
        try:
            server_in, server_out = await asyncio.open_connection(host, int(port))
        except OSError:
            client_out.close()
            return
        try:
            await asyncio.gather(self._pipe(client_in, server_out, limited=False),
                                 self._pipe(server_in, client_out, limited=True), return_exceptions=True)
        except asyncio.CancelledError:  # the proxy stops
            client_out.close()
            server_out.close()

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, limited: bool) -> None:
        try:
            while data := await source.read(64 * 1024):
                if limited and (wait := self.bucket.delay(len(data))):
                    await asyncio.sleep(wait)
                sink.write(data)
                await sink.drain()
        except OSError:
            pass
        finally:
            sink.close()

    def stop(self) -> None:
        """Close the listener and every connection through it, then the loop."""
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
