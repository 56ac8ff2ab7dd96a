"""What the daemon answers without changing anything: status, the stack list, history, the
dashboard's time series and charts, benchmark runs, reports and their files, engine logs and its
own metrics. Each runs on a worker thread (the API's `Queries`). The daemon holds the catalog and
the policy already read, so a command that shows them (`stacks list`, `status`) need not import
them."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from sparkctl.adapters.docker import DockerEngine
from sparkctl.bench import metrics
from sparkctl.daemon import planner
from sparkctl.daemon.charts import CHARTS, chart
from sparkctl.daemon.metrics import DaemonMetrics
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.routes import Routes
from sparkctl.daemon.series import Recorder
from sparkctl.errors import ImageRefused, NoSuchFile, SparkctlError
from sparkctl.messages import (
    BanRow,
    DeploymentRow,
    EventRow,
    History,
    MemoryHeld,
    ReportRow,
    RunRow,
    Series,
    StackRow,
    Status,
    StatusRow,
)
from sparkctl.phase import Phase
from sparkctl.policy.images import ImagePolicy, check
from sparkctl.policy.switch import Memory
from sparkctl.settings import Settings
from sparkctl.spec.engine import Weights
from sparkctl.spec.load import Catalog
from sparkctl.state.desired import Desired, DesiredFile
from sparkctl.state.store import Store

REPORT_KINDS = {"reports": "comparison.md", "bench": "agent.md"}  # state-dir folder -> its reports' page



def report_file(state_dir: Path, report: str, path: str) -> Path:
    """A file of a written report (`report`: `reports/<name>` or `bench/<name>`, a folder holding its
    page); NoSuchFile for anything else, a path that leaves the folder (`..`, a link) included."""
    kind, _, name = report.partition("/")
    base = (state_dir / kind).resolve()
    root = (base / name).resolve()
    wanted = (root / path).resolve()
    if kind not in REPORT_KINDS or root.parent != base or not (root / REPORT_KINDS[kind]).is_file() \
            or not wanted.is_relative_to(root) or not wanted.is_file():
        raise NoSuchFile(f"no file {path!r} in report {report!r}")
    return wanted


@dataclass
class Reads:
    settings: Settings
    desired_file: DesiredFile
    catalog: Callable[[], Catalog]
    docker: DockerEngine
    store: Store
    reconciler: Reconciler
    routes: Routes
    metrics: DaemonMetrics
    recorder: Recorder  # the dashboard's time series
    memory: Callable[[], Memory]  # unified memory as the planner sees it now

    def check_stack(self, name: str) -> str:
        return self.catalog().stack(name).name

    def desired(self) -> Desired:
        return self.desired_file.read()

    def status(self) -> Status:
        """The CLI's status rows, plus desired stacks without a container and failure marks."""
        desired, catalog, policy = self.desired_file.read(), self.catalog(), self.store.images.policy()
        rows = status_rows(self.docker, self.store, catalog)
        seen = {r.stack for r in rows}
        history = self.reconciler.history
        rows += [StatusRow(s, "failed" if history.get(s, planner.History()).failed else "pending", "absent", "", None,
                           "", None, None, None, None) for s in desired.stacks if s not in seen]
        rows += [StatusRow(s.name, Phase.FETCHED.value, "absent", "", latest.fingerprint, "", None, None, None, None)
                 for s in catalog.deployable() if s.name not in seen and s.name not in desired.stacks
                 and (latest := self.store.deployments.latest(s.name)) and latest.phase is Phase.FETCHED]
        restarts = Counter(e["stack"] for e in self.store.events.list(limit=10_000) if e["kind"] == "restarted")
        memory = self.memory()
        return Status(tuple(self._full(row, catalog, policy, restarts) for row in rows),
                      other_instances(self.docker), aliases=desired.aliases, pid=os.getpid(),
                      instance=self.settings.instance,
                      memory=MemoryHeld(memory.held, memory.ceiling, memory.parked),
                      catalog=tuple(sorted(s.name for s in catalog.deployable())))

    def _full(self, row: StatusRow, catalog: Catalog, policy: ImagePolicy, restarts: Counter[str]) -> StatusRow:
        """A row with what the daemon knows beside the container: desired, failures, parked, image."""
        desired, h = self.desired_file.read(), self.reconciler.history.get(row.stack, planner.History())
        parked = desired.parked.get(row.stack)
        phase = row.phase if parked is None else f"parked (sleep level {parked})" if parked else "parked (stopped)"
        image, digest, verdict = self._image(row.stack, catalog, policy)
        return replace(row, phase=phase, desired=row.stack in desired.stacks, failed=h.failed,
                       recent_failures=len(h.failures), parked=parked, restarts=restarts[row.stack],
                       acceptance=self._acceptance(row.stack, catalog) if row.state == "running" else None,
                       image=image, digest=digest, verdict=verdict, quality=self._quality(row.stack))

    def stacks(self) -> tuple[StackRow, ...]:
        """`sparkctl stacks list`'s rows, from the catalog and policy as the files are now."""
        return stack_rows(self.catalog(), self.store.images.policy())

    def _image(self, stack: str, catalog: Catalog, policy: ImagePolicy) -> tuple[str | None, str | None, str | None]:
        """A stack's image as written, the digest its last deploy ran, and the policy's verdict on it."""
        try:
            image = catalog.stack(stack).image
        except SparkctlError:
            return None, None, None
        latest = self.store.deployments.latest(stack)
        digest = latest.parts.get("image") if latest else None
        pin = policy.pin_for(image.ref)
        if (ban := policy.ban_for(image.ref, digest)) is not None:
            verdict = f"blacklisted: {ban[1].reason}"
        elif pin is not None and pin.known_good:
            verdict = "known-good"
        elif pin is not None and pin.first_seen:
            verdict = "first seen"
        else:
            verdict = "pinned" if pin is not None else "unpinned"
        return image.ref, digest, verdict

    def _quality(self, stack: str) -> str | None:
        """The stack's last quality run and its gate's verdict, in one line (None: never measured)."""
        last = next(iter(self.store.quality.runs(stack, limit=1)), None)
        return f"{last.summary()}: {last.verdict or ('failed' if last.error else 'measuring')}" if last else None

    @staticmethod
    def _acceptance(stack: str, catalog: Catalog) -> float | None:
        """The engine's speculative acceptance since it started, from its /metrics (None: no speculation)."""
        try:
            counters = metrics.read(catalog.stack(stack).url)
        except SparkctlError:
            return None
        return metrics.between({}, counters).acceptance if counters is not None else None

    def series(self) -> Series:
        """The dashboard's last 15 minutes, with the alias switches of the window marked."""
        switches = [(float(r["at"]), f"{r.get('alias', '?')}: {r.get('from') or '—'} → {r.get('to', '?')}")
                    for r in self.store.switches.list(limit=100)]
        return self.recorder.series(switches)

    def chart(self, name: str) -> str:
        if name not in CHARTS:
            raise SparkctlError(f"no chart {name!r}; the charts: {', '.join(CHARTS)}")
        return chart(self.series(), name, now=time.time())

    def history(self, stack: str | None) -> History:
        store = self.store
        deployments = tuple(DeploymentRow(d.id, d.stack, d.phase.value, d.fingerprint, d.started, d.finished, d.error,
                                          tuple((p.value, at, detail) for p, at, detail
                                                in store.deployments.transitions(d.id)))
                            for d in store.deployments.history(stack))
        bans = tuple(BanRow(ref, ban.reason, ban.date.isoformat() if ban.date else None)
                     for ref, ban in self.store.images.policy().blacklist.items())
        events = tuple(EventRow(**e) for e in store.events.list(stack))
        return History(deployments, events, tuple(store.switches.list()), bans)

    def runs(self) -> tuple[RunRow, ...]:
        """The stored benchmark runs with results, newest first (the dashboard's Compare picks from them)."""
        return tuple(RunRow(r.id, r.stack, r.profile, r.started, r.verdict, len(r.rows))
                     for r in self.store.bench.runs(limit=200) if r.rows)

    def reports(self) -> tuple[ReportRow, ...]:
        """The written reports, newest first: comparisons (`reports/<time>`) and agent sessions
        (`bench/agent-<time>`), each with its markdown file."""
        found = [ReportRow(f"{kind}/{folder.name}", page, folder.stat().st_mtime)
                 for kind, page in REPORT_KINDS.items() for folder in (self.settings.state_dir / kind).glob("*")
                 if (folder / page).is_file()]
        return tuple(sorted(found, key=lambda r: -r.time))

    def report_file(self, report: str, path: str) -> Path:
        return report_file(self.settings.state_dir, report, path)

    def logs(self, stack: str, tail: int) -> AsyncIterator[bytes]:
        """A stack's engine log as docker streams it (its last `tail` lines, then following), to be
        read on the loop; `aclose()` ends it."""
        found = self.docker.containers(self.check_stack(stack))
        if not found:
            raise SparkctlError(f"{stack} has no container; `sparkctl status` lists what runs")
        return self.docker.follow_logs(found[0].id, tail=tail)

    def metrics_text(self) -> str:
        states = {c.stack: c.state for c in self.docker.containers() if not c.placed}
        states |= {s: "failed" for s, h in self.reconciler.history.items() if h.failed}
        return self.metrics.render(passes=self.reconciler.passes, restarts=self.reconciler.restarts, states=states)


def other_instances(docker: DockerEngine) -> dict[str, list[str]]:
    """Other sparkctl instances on this engine and their stacks: mentioned, never touched."""
    others: dict[str, list[str]] = {}
    for c in docker.others():
        others.setdefault(c.instance, []).append(c.stack)
    return {name: sorted(stacks) for name, stacks in sorted(others.items())}


def status_rows(docker: DockerEngine, store: Store, catalog: Catalog) -> list[StatusRow]:
    """One row per sparkctl container, joined with the store's latest deployment and the KV
    headroom recorded for its build (`kv`: figures, full-context fit, summary, warnings; None when
    unknown)."""
    now = time.time()
    rows = []
    for c in sorted(docker.containers(), key=lambda c: c.stack):
        name = c.stack
        latest = store.deployments.latest(name)
        try:
            endpoint = f"{catalog.stack(name).url}/v1"
        except SparkctlError:
            endpoint = ""
        headroom = store.deployments.headroom(name, c.fingerprint) if c.fingerprint else None
        rows.append(StatusRow(name, latest.phase.value if latest and c.running else c.state, c.state, endpoint,
                              c.fingerprint, c.name, round(now - c.created) if c.running else None, c.memory,
                              latest.error if latest else None, headroom.as_row() if headroom else None))
    return rows


def stack_rows(catalog: Catalog, policy: ImagePolicy) -> tuple[StackRow, ...]:
    """A row per deployable stack, with what the image policy says of its image, then a row per
    file left out with its error (`invalid`)."""
    deployable = tuple(StackRow(s.name, str(s.kind), s.image.ref, _weights(s.model), _weights(s.draft),
                                s.resources.gpu_memory_utilization, s.port,
                                *_verdict(policy, s.image.ref, s.image.allow_latest), source=catalog.source(s.name))
                        for s in catalog.deployable())
    return deployable + tuple(StackRow(i.name, i.kind, "-", "-", "-", None, None, False, "-", i.brief,
                                       source=catalog.source(i.name, i.file)) for i in catalog.invalid)


def _verdict(policy: ImagePolicy, ref: str, allow_latest: bool) -> tuple[bool, str]:
    """Whether the policy refuses the image, and its verdict (or why it refuses)."""
    try:
        check(policy, ref, allow_latest=allow_latest)
    except ImageRefused as e:
        return True, str(e).split(":")[0]
    pin = policy.pin_for(ref)
    if pin is None:
        return False, "ok"
    return False, f"pinned {pin.digest[7:19]}" if pin.digest else "known-good tag, digest at first up"


def _weights(weights: Weights | None) -> str:
    if weights is None:
        return "-"
    return weights.path or f"{weights.repo}@{weights.revision}"
