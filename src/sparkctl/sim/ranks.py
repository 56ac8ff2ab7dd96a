"""The simulated engine's multi-node mode: `--nnodes N --node-rank r --master-addr A --master-port P
[--headless]`, as vLLM's `mp` executor takes them.

Rank 0 listens on the master address and waits for the other N-1 ranks to connect before it
serves; each completion then takes one step with every rank (a line out, a line back), as a
collective would. The three ways plain `/health` polling is fooled follow from that, as on real
vLLM (issue 18's study):
- a worker rank dies: rank 0's step finds the connection closed and the completion fails with a
  500, while `/health` and `/v1/models` stay 200;
- rank 0 dies: a headless worker notices nothing it acts on and stays alive, silent;
- the link goes down: the step's line never comes back, so completions hang while `/health`
  (answered by rank 0 alone) stays 200.
A worker that cannot reach rank 0 keeps retrying, as vLLM's rendezvous does, until
`RENDEZVOUS_S`. Self-contained (it runs in the sim image with nothing else of sparkctl).
"""

from __future__ import annotations

import asyncio
import time

from sparkctl.sim.engine import die as _die
from sparkctl.sim.engine import log as _log

RENDEZVOUS_S = 600.0  # how long a rank waits for the group to form


class GroupBroken(RuntimeError):
    """A rank of the group is gone: the step cannot complete."""


class Group:
    """Rank 0's side: the other ranks' connections, one step at a time."""

    def __init__(self, nnodes: int) -> None:
        self.nnodes = nnodes
        self.peers: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self.formed = asyncio.Event()
        self.lock = asyncio.Lock()

    async def form(self, address: str, port: int) -> None:
        """Listen at the master address until every other rank has connected."""
        server = await asyncio.start_server(self._joined, address, port)
        _log(f"rank 0 waits for {self.nnodes - 1} rank(s) at {address}:{port}")
        try:
            await asyncio.wait_for(self.formed.wait(), RENDEZVOUS_S)
        except TimeoutError:
            _die(f"RuntimeError: timed out after {RENDEZVOUS_S:g} s waiting for {self.nnodes - 1} rank(s) "
                 f"at {address}:{port} (got {sorted(self.peers)})")
        server.close()
        _log(f"all {self.nnodes} ranks joined; world size {self.nnodes}")

    async def step(self) -> None:
        """One collective step with every rank; GroupBroken when one is gone (a hang when the
        link is down: nothing comes back, as with NCCL)."""
        async with self.lock:
            for rank, (reader, writer) in sorted(self.peers.items()):
                try:
                    writer.write(b"step\n")
                    await writer.drain()
                    answer = await reader.readline()
                except (ConnectionError, OSError) as e:
                    raise GroupBroken(f"rank {rank}: {e}") from None
                if answer != b"ok\n":
                    raise GroupBroken(f"rank {rank} closed its connection")

    async def _joined(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hello = (await reader.readline()).decode().split()
        if len(hello) == 2 and hello[0] == "rank" and hello[1].isdigit():
            self.peers[int(hello[1])] = (reader, writer)
            _log(f"rank {hello[1]} joined from {writer.get_extra_info('peername')}")
        if len(self.peers) >= self.nnodes - 1:
            self.formed.set()


async def worker(rank: int, address: str, port: int) -> None:
    """A headless rank: join rank 0 (retrying), then answer its steps for as long as it runs,
    and when rank 0 goes away, stay alive and silent."""
    deadline = time.monotonic() + RENDEZVOUS_S
    while True:
        try:
            reader, writer = await asyncio.open_connection(address, port)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                _die(f"RuntimeError: rank {rank} could not reach rank 0 at {address}:{port}: {e}")
            await asyncio.sleep(0.2)
    writer.write(f"rank {rank}\n".encode())
    await writer.drain()
    _log(f"rank {rank} joined rank 0 at {address}:{port} (headless)")
    while line := await reader.readline():
        if line == b"step\n":
            writer.write(b"ok\n")
            await writer.drain()
    await asyncio.Event().wait()  # rank 0 is gone; vLLM's headless worker does not notice either

