"""`sparkctl bench run` in the daemon: a running stack benchmarked in its turn (no deploy, down
or park of it meanwhile) and marked busy (reconcile passes and the idle park leave it alone: its
requests bypass the gateway), the run stored with its fingerprint and judged by the stack's
gate (`bench/stack.py`: a pass pins the digest as known-good). Each test's start goes out as a
note; a cancel, a `down` or the daemon's stop (its `stop` is among the `Fetches`) ends
llama-benchy at its next request, and the run is stored as failed. `-p quality` measures the
stack's accuracy with lm-eval instead (`bench/quality.py`: a quality run, judged by its quality
gate), through the gateway, in the same turn. A coroutine on the loop; the run and its gate on a
worker."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

from sparkctl.adapters.docker import DockerEngine
from sparkctl.bench import quality
from sparkctl.bench import stack as bench_stack
from sparkctl.bench.profiles import QUALITY, choose
from sparkctl.bench.runner import Progress
from sparkctl.daemon.fetches import Fetches
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.progress import Reporter, Stopped
from sparkctl.messages import BenchDone, BenchRequest
from sparkctl.settings import Settings
from sparkctl.spec.load import Catalog
from sparkctl.state.store import Store


class Benchmarks:
    def __init__(self, *, settings: Settings, store: Store, docker: DockerEngine, catalog: Callable[[], Catalog],
                 turns: Turns, holding: Callable[[str], AbstractContextManager], reporter: Reporter,
                 fetches: Fetches) -> None:
        self.settings, self.store, self.docker, self.catalog = settings, store, docker, catalog
        self.turns, self.holding, self.reporter, self.fetches = turns, holding, reporter, fetches

    async def run(self, stack: str, ask: BenchRequest, *, ticket: int | None = None,
                  stop: threading.Event | None = None) -> BenchDone:
        """Benchmark the running `stack` with the profile `ask` chooses (default: the stack's).
        `stop`, set (a cancel), ends llama-benchy; it is set once the run is measured."""
        async with self.turns.turn(stack, ticket):
            with self.holding(stack):
                return await blocking(self._run, stack, ask, stop)

    def _run(self, stack: str, ask: BenchRequest, stop: threading.Event | None) -> BenchDone:
        spec = self.catalog().stack(stack)
        if ask.profile == QUALITY:
            return quality.on_demand(spec, ask, settings=self.settings, store=self.store)
        profile = choose(ask.profile or spec.bench_profile, depths=ask.depths, runs=ask.runs,
                         temperature=ask.temperature)
        with self.fetches.running(stack, stop) as stop:
            result = bench_stack.benchmark(spec, settings=self.settings, store=self.store, profile=profile,
                                           skip_coherence=ask.skip_coherence, docker=self.docker,
                                           on_progress=self._progress(stack, stop))
        stop.set()  # past what a cancel stops: the gate judges the run
        verdict = bench_stack.gate(spec, result, store=self.store)
        return BenchDone(stack, result.id, profile.name, result.folder, verdict.passed, verdict.describe(),
                         tuple(result.rows))

    def _progress(self, stack: str, stop: threading.Event) -> Callable[[Progress], None]:
        started: set[tuple[int, int]] = set()

        def progress(now: Progress) -> None:
            if stop.is_set():
                raise Stopped("stopped: llama-benchy was stopped at its next request")
            if (now.depth, now.concurrency) not in started:
                started.add((now.depth, now.concurrency))
                self.reporter.note(stack, f"measuring depth {now.depth} at concurrency {now.concurrency} "
                                          f"({now.done}/{now.total} requests done)")

        return progress
