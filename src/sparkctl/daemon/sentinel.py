"""The host-wedge sentinel and the hang watch: what keeps a Spark alive unattended.

On GB10 the worst failure is a frozen host, not a failed request: the driver logs
`NVRM: ... NV_ERR_NO_MEMORY` and the machine goes silent, without an OOM kill (docs/design.md,
"Unified memory safety"). The sentinel waits on the kernel log (`adapters/kernellog.py`) on the
event loop, and once a second reads MemAvailable (and its slope) and writes its last words
(`state/lastwords.py`). On a warning sign (`policy/wedge.py`) it acts at once: the gateway admits
no new request for the engine that grew last (503 with Retry-After), that engine is killed and
recorded parked (`Sleeper.halt`), and the log says what and why.

The hang watch rides the same tick: for a stack with requests in flight through the gateway it
reads the engine's /metrics; generated and prompt tokens flat past `hang_after` while requests run
is a hang (a deadlocked engine keeps /health green). The engine leaves routing (its unanswered
requests wait for it, its streams under way end), is killed, and the reconciler restarts it under
the crash-loop rules (its death counts); once the restarted engine answers, it is routed again.

Everything here runs on the daemon's event loop, which owns the gateway; reads and writes that
block (meminfo, /metrics, Docker, the fsync) run on workers through the seam (`seam.blocking`).
Built and run by `daemon/app.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from sparkctl.adapters.docker import DockerEngine
from sparkctl.adapters.kernellog import FOLLOW, KernelLog, open_log
from sparkctl.bench import metrics
from sparkctl.daemon.routes import Routes
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.sleeper import Sleeper
from sparkctl.deploy.memory import GIB, meminfo
from sparkctl.gateway.proxy import Gateway
from sparkctl.policy import wedge
from sparkctl.policy.wedge import Progress, Warning
from sparkctl.state.lastwords import LastWords
from sparkctl.state.store import Store

log = structlog.get_logger()

EVERY = 1.0  # s between two ticks (a record, a memory sample, the hang watch)
SAMPLES = 10  # memory samples kept (the slope needs the last few seconds)
KERNEL_KEPT = 5  # kernel warnings kept for the last words
REFUSE_S = 60.0  # s the gateway refuses the stopped engine's requests (extended by each new sign)
SETTLE_S = 5.0  # s after a stop before another warning sign stops another engine: the freed memory shows first


@dataclass(frozen=True)
class Held:
    """A hung engine out of routing while the reconciler restarts it."""

    url: str
    progress: Progress  # its counters when it was declared hung: a restarted engine's start over


class Sentinel:
    def __init__(self, *, gateway: Gateway, routes: Routes, sleeper: Sleeper, docker: DockerEngine,
                 store: Store, state_dir: Path,
                 kernel_log: str, meminfo_path: Path, floor: int, hang_after: float,
                 started: Callable[[], dict[str, float]], failed: Callable[[str], bool]) -> None:
        """`started()`: each running engine's last start or wake (epoch s); `failed(stack)`: the
        reconciler gave up on it (a crash loop)."""
        self.gateway, self.routes, self.sleeper, self.docker, self.store = gateway, routes, sleeper, docker, store
        self.kernel_log, self.meminfo_path, self.floor, self.hang_after = kernel_log, meminfo_path, floor, hang_after
        self.started, self.failed = started, failed
        self.words = LastWords(state_dir)
        self.samples: deque[tuple[float, int]] = deque(maxlen=SAMPLES)
        self.kernel: deque[str] = deque(maxlen=KERNEL_KEPT)
        self.progress: dict[str, Progress] = {}  # stack -> its engine's, while requests run
        self.held: dict[str, Held] = {}  # stack -> its hung engine, until the restarted one answers
        self.source: str | None = None  # the kernel log read, once open
        self._calm_at = 0.0  # before this (epoch s) a sign stops no further engine
        self._acting = asyncio.Lock()
        self._log: KernelLog | None = None
        self._tasks: list[asyncio.Task] = []
        self._acts: set[asyncio.Task] = set()

    def restarting(self) -> set[str]:
        """Stacks kept routed while their hung engine restarts (`Routes.restarting`)."""
        return set(self.held)

    async def run(self) -> None:
        """Until cancelled: the previous run's ending reported, the kernel log waited on, a tick a second."""
        ending = await blocking(self.words.begin)
        if ending is not None:
            log.warning("previous_run_unclean", summary=ending.summary())
        await self._open_kernel_log()
        try:
            while True:
                began = time.monotonic()
                try:
                    await self._tick()
                except Exception as e:  # noqa: BLE001 - the sentinel outlives any one bad tick
                    log.error("sentinel_tick_failed", error=f"{type(e).__name__}: {e}"[:300])
                await asyncio.sleep(max(0.0, EVERY - (time.monotonic() - began)))
        finally:
            self._close_kernel_log()

    def stopped(self) -> None:
        """The daemon stops cleanly (after `run` was cancelled)."""
        self.words.stopped()

    # --- the kernel log -------------------------------------------------------------------------
    async def _open_kernel_log(self) -> None:
        opened = await blocking(open_log, self.kernel_log)  # `auto` may ask journalctl first
        if isinstance(opened, str):
            log.warning("kernel_log_unreadable", reason=opened, note="the sentinel watches memory only")
            return
        self._log, self.source = opened, opened.source
        if opened.pollable:
            asyncio.get_running_loop().add_reader(opened.fd, self._readable)
        else:
            self._tasks.append(asyncio.create_task(self._follow()))
        log.info("sentinel_watching", kernel_log=opened.source, meminfo=str(self.meminfo_path),
                 floor_gib=round(self.floor / GIB, 2), hang_after=self.hang_after)

    def _close_kernel_log(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._log is not None:
            if self._log.pollable:
                with contextlib.suppress(Exception):
                    asyncio.get_running_loop().remove_reader(self._log.fd)
            self._log.close()

    def _readable(self) -> None:
        assert self._log is not None
        for line in self._log.read():
            self._line(line)
        if self._log.ended:  # else the loop would call this again and again on the closed pipe
            asyncio.get_running_loop().remove_reader(self._log.fd)
            log.warning("kernel_log_unreadable", reason=f"{self._log.source} ended",
                        note="the sentinel watches memory only")

    async def _follow(self) -> None:
        """A regular file (tests) cannot be waited on: read what was appended, every FOLLOW s."""
        while True:
            self._readable()
            await asyncio.sleep(FOLLOW)

    def _line(self, text: str) -> None:
        warning = wedge.kernel_line(text)
        if warning is None:
            return
        self.kernel.append(f"{time.strftime('%H:%M:%S')} {warning.detail}")
        log.warning("kernel_warning", sign=str(warning.sign), line=warning.detail)
        low = self.samples and wedge.memory(self.samples, floor=self.floor)
        if warning.sign.acts or low:
            task = asyncio.get_running_loop().create_task(self._act(warning))
            self._acts.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(self._acts.discard)

    # --- the tick ---------------------------------------------------------------------------------
    async def _tick(self) -> None:
        table = self.routes.table
        busy = {s for s, n in self.gateway.ledger.snapshot().in_flight.items() if n} | set(self.held)
        urls = {s: u.url for s, u in table.upstreams.items() if s in busy and not u.placed}
        available, readings = await blocking(self._read, urls)
        now = time.time()
        self.samples.append((now, available))
        if (warning := wedge.memory(self.samples, floor=self.floor)) is not None:
            await self._act(warning)
        await self._watch(readings, urls, now)
        await blocking(self.words.append, self._record(now))

    def _read(self, urls: dict[str, str]) -> tuple[int, dict[str, dict[str, float] | None]]:
        return meminfo("MemAvailable", self.meminfo_path), {s: metrics.read(u) for s, u in urls.items()}

    def _record(self, now: float) -> dict[str, Any]:
        table = self.routes.table
        engines = {s: "hung, restarting" if s in self.held else "serving" for s in table.upstreams}
        engines |= {s: "parked" for s in table.parked.values()}
        engines |= {s: "refusing requests" for s, (_, until) in self.gateway.refusing.items()
                    if until > time.monotonic()}
        available = self.samples[-1][1] if self.samples else None
        return {"at": round(now, 3), "available_gib": None if available is None else round(available / GIB, 2),
                "slope_mib_s": round(wedge.slope(self.samples) / wedge.MIB, 1), "engines": engines,
                "kernel": list(self.kernel)}

    # --- acting on a warning sign --------------------------------------------------------------------
    async def _act(self, warning: Warning) -> None:
        """Stop the engine that grew last, once per SETTLE_S; what was seen is on disk first."""
        async with self._acting:
            now = time.time()
            await blocking(self.words.append, {**self._record(now), "sign": str(warning.sign)})
            if now < self._calm_at:
                return
            began = time.monotonic()
            stack = wedge.grew_last(await blocking(self.started))
            if stack is None:
                log.warning("sentinel_warning", sign=str(warning.sign), detail=warning.detail,
                            action="none: no engine of this instance runs")
                return
            why = f"{warning.sign}: {warning.detail}"
            self.gateway.refuse(stack, f"the host is short of memory ({warning.sign})", REFUSE_S)
            self._calm_at = now + SETTLE_S
            killed = await blocking(self.sleeper.halt, stack, why)
            log.warning("sentinel_stopped_engine", stack=stack, sign=str(warning.sign), detail=warning.detail,
                        containers=[c[:12] for c in killed], took_s=round(time.monotonic() - began, 3),
                        refused_for_s=REFUSE_S, reason="it grew last; the host could freeze (NV_ERR_NO_MEMORY)")
            await blocking(self.routes.refresh)

    # --- the hang watch ---------------------------------------------------------------------------------
    async def _watch(self, readings: dict[str, dict[str, float] | None], urls: dict[str, str], now: float) -> None:
        self.progress = {s: p for s, p in self.progress.items() if s in readings}
        for stack in [s for s in self.held if s not in readings]:  # taken down meanwhile: out of the table
            self.gateway.restore_engine(self.held.pop(stack).url)
        for stack, counters in readings.items():
            if stack in self.held:
                await self._restarted(stack, counters)
            elif counters is not None:
                p = self.progress[stack] = wedge.progress(self.progress.get(stack), counters, now)
                if wedge.hung(p, now, bound=self.hang_after):
                    await self._hung(stack, urls[stack], p, now)

    async def _hung(self, stack: str, url: str, p: Progress, now: float) -> None:
        why = (f"no token generated or prefilled for {now - p.moved:.1f} s with {p.running:g} requests running "
               f"(SPARKCTL_HANG_AFTER {self.hang_after:g} s); /health may still say 200")
        self.held[stack] = Held(url, p)
        self.progress.pop(stack, None)
        self.gateway.eject_engine(url)
        log.warning("engine_hung", stack=stack, reason=why,
                    action="out of routing, killed; the reconciler restarts it under the crash-loop rules")
        await blocking(self._kill, stack, why)

    def _kill(self, stack: str, why: str) -> None:
        for c in self.docker.containers(stack):
            if c.running and not c.placed:
                self.docker.kill(c.id)
        self.store.events.record(stack, "hung", why)

    async def _restarted(self, stack: str, counters: dict[str, float] | None) -> None:
        """Routed again once the restarted engine answers (its counters started over); let go if
        the reconciler gave up on it."""
        held = self.held[stack]
        fresh = counters and wedge.progress(None, counters, 0.0)
        back = bool(fresh) and (fresh.prompt < held.progress.prompt or fresh.generated < held.progress.generated)
        if not back and not self.failed(stack):
            return
        del self.held[stack]
        self.gateway.restore_engine(held.url)
        log.info("engine_routed_again", stack=stack, restarted=back)
        await blocking(self.routes.refresh)
