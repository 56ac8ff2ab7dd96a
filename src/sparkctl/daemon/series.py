"""The dashboard's time series: every SAMPLE_EVERY seconds the daemon samples each routed engine's
counters (generated tokens, the time-to-first-token histogram), the gateway's requests in flight
and queued per stack, and unified memory as the planner sees it; the last WINDOW of samples is
kept in memory (a restarted daemon starts a new window). `series()` turns consecutive samples
into rates and medians (`messages.Series`), with the alias switches of the window marked.

The sampler runs on the event loop, which owns the gateway's ledger, and reads engines and Docker
on a worker thread; samples are appended and read under a lock, so the API's worker threads read
them without touching anything of the loop's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from sparkctl.bench import metrics
from sparkctl.daemon.seam import blocking
from sparkctl.gateway.ledger import Snapshot
from sparkctl.gateway.routes import RouteTable
from sparkctl.messages import Series, StackSeries
from sparkctl.policy.switch import Memory

log = structlog.get_logger()
SAMPLE_EVERY = 5.0  # s between two samples
WINDOW = 15 * 60.0  # s of samples kept
GENERATED, TTFT = "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds"


@dataclass(frozen=True)
class Sample:
    at: float
    engines: dict[str, dict[str, float]]  # stack -> its engine's readings (absent: it did not answer)
    requests: Snapshot  # the gateway's ledger
    memory: Memory


class Recorder:
    """`engines()` and `memory()` are read on a worker thread, `requests()` on the loop."""

    def __init__(self, *, engines: Callable[[], dict[str, dict[str, float]]], memory: Callable[[], Memory],
                 requests: Callable[[], Snapshot], every: float = SAMPLE_EVERY) -> None:
        self.engines, self.memory, self.requests, self.every = engines, memory, requests, every
        self.samples: deque[Sample] = deque(maxlen=int(WINDOW / every) + 1)
        self.lock = threading.Lock()

    async def run(self) -> None:
        """Sample until cancelled (the daemon's stop); a sample that fails (Docker restarting) is
        left out, and the series has a gap there."""
        while True:
            try:
                engines, memory = await blocking(lambda: (self.engines(), self.memory()))
            except Exception as e:  # noqa: BLE001 - the sampler outlives any one bad read
                log.warning("series_sample_failed", error=str(e)[:200])
            else:
                sample = Sample(time.time(), engines, self.requests(), memory)
                with self.lock:
                    self.samples.append(sample)
            await asyncio.sleep(self.every)

    def series(self, switches: list[tuple[float, str]]) -> Series:
        """The window as rates between consecutive samples (the first one has none before it)."""
        with self.lock:
            samples = list(self.samples)
        pairs = list(zip(samples, samples[1:], strict=False))
        names = sorted({name for s in samples for name in (*s.engines, *s.requests.accepted)})
        stacks = {name: StackSeries(
            tps=tuple(_rate(a, b, name) for a, b in pairs),
            ttft_p50_ms=tuple(_median_ms(a, b, name) for a, b in pairs),
            in_flight=tuple(b.requests.in_flight.get(name, 0) for _, b in pairs),
            queued=tuple(b.requests.accepted.get(name, 0) - b.requests.in_flight.get(name, 0) for _, b in pairs))
            for name in names}
        later = [b for _, b in pairs]
        awake = tuple(sum(f for s, f in b.memory.held.items() if s not in b.memory.parked) for b in later)
        parked = tuple(sum(f for s, f in b.memory.held.items() if s in b.memory.parked) for b in later)
        since = later[0].at - self.every if later else time.time()
        return Series(at=tuple(b.at for b in later), stacks=stacks, awake=awake, parked=parked,
                      free=tuple(max(0.0, 1 - a - p) for a, p in zip(awake, parked, strict=True)),
                      ceiling=later[-1].memory.ceiling if later else 0.0,
                      switches=tuple((at, what) for at, what in switches if at >= since))


def readings(table: RouteTable) -> dict[str, dict[str, float]]:
    """Each routed stack's engine readings now that the series uses (its generated tokens and TTFT
    buckets: a window of whole /metrics readings would hold ~10 MB); a stack whose engine did not
    answer is absent."""
    found = {}
    for stack, upstream in table.upstreams.items():
        if (counters := metrics.read(upstream.url, dict(upstream.headers or []))) is not None:
            found[stack] = {k: v for k, v in counters.items() if k == GENERATED or k.startswith(f"{TTFT}_bucket{{")}
    return found


def _rate(before: Sample, after: Sample, stack: str) -> float | None:
    a, b = before.engines.get(stack), after.engines.get(stack)
    if a is None or b is None or after.at <= before.at or b.get(GENERATED, 0.0) < a.get(GENERATED, 0.0):
        return None  # no reading, or the engine restarted between them
    return (b.get(GENERATED, 0.0) - a.get(GENERATED, 0.0)) / (after.at - before.at)


def _median_ms(before: Sample, after: Sample, stack: str) -> float | None:
    a, b = before.engines.get(stack), after.engines.get(stack)
    if a is None or b is None:
        return None
    median = metrics.quantile(a, b, TTFT, 0.5)
    return None if median is None else median * 1000
