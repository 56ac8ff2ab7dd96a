"""Trials: a blacklisted tag measured again (`deploy/retest.py`), and a comparison report of
stored benchmark runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sparkctl import report
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.turns import Turns
from sparkctl.deploy import retest
from sparkctl.deploy.pipeline import Deployer
from sparkctl.deploy.retest import reported_spec
from sparkctl.errors import SparkctlError
from sparkctl.messages import ReportWritten, RetestDone
from sparkctl.settings import Settings
from sparkctl.spec.load import Catalog
from sparkctl.state.store import Store


@dataclass(kw_only=True)
class Trials:
    settings: Settings
    catalog: Callable[[], Catalog]
    deployer: Callable[[], Deployer]
    reconciler: Reconciler
    turns: Turns
    store: Store

    def retest_target(self, ref: str, stack: str) -> tuple[str, str]:
        """The trial a retest of `ref` runs and the stack it measures with (before the action streams)."""
        chosen = retest.choose_stack(self.catalog(), ref, stack or None).name
        return retest.trial_name(chosen), chosen

    async def retest(self, ref: str, *, stack: str, force: bool = False, ticket: int | None = None) -> RetestDone:
        """Measure what a blacklisted tag names now, as a trial of `stack` that no pass touches
        (`deploy/retest.py`): the ban lifted on a pass, kept with the measurement on a failure."""
        async with self.turns.turn("retest:", ticket):  # one at a time (no stack name has a colon)
            deployer = self.deployer()
            trial = await blocking(retest.prepare, ref, stack=stack, force=force, deployer=deployer)
            with self.reconciler.holding(trial.spec.name):
                return await blocking(retest.run, trial, deployer)

    def compare(self, runs: list[int], label: str = "") -> ReportWritten:
        """A comparison report of these benchmark runs, written as `sparkctl bench report` writes it."""
        found = [self.store.bench.run(i) for i in runs]
        if not found or None in found:
            raise SparkctlError(f"no such benchmark runs among {runs}; `sparkctl bench list` shows them")
        catalog = self.catalog()
        path = report.compare([(reported_spec(catalog, run.stack), run) for run in found], self.settings,
                              self.store, label=label)
        return ReportWritten(f"reports/{path.parent.name}", report.REPORT)
