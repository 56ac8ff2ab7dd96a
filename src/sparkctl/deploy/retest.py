"""`sparkctl image retest`: re-qualify a blacklisted tag by measuring what it names now.

The tag is resolved on its registry now, and `policy.images.plan_retest` says whether that is
worth measuring (not when nothing changed, unless forced). The digest then runs as a trial of
the stack that uses the image's repository: a stack of its own name (`<stack>.retest`), so it
is in no desired state and no alias and the gateway never routes to it, alone on the machine,
through the normal deploy pipeline with only the tag's bans lifted. The stack's gate judges a
benchmark that goes past the concurrency where the banned image fell over; a stack that sets
`expectations.quality` has its quality measured too (at the trial's engine, against the stack's
last passing quality run), and both gates must pass. The trial is removed afterwards, pass or
fail. A pass lifts the bans and pins the tag to the digest as known-good (provenance: the runs);
a failure keeps the ban and appends the measurement to it.

Called by the daemon's `retest` operation (`sparkctl image retest` asks the daemon), which holds
the trial's name, so reconcile passes leave its container alone.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from sparkctl.bench import quality
from sparkctl.bench import stack as bench_stack
from sparkctl.bench.gate import judge, requalifying
from sparkctl.bench.runner import Progress
from sparkctl.deploy.health import HealthError
from sparkctl.deploy.pipeline import Deployer
from sparkctl.errors import SparkctlError
from sparkctl.messages import RetestDone
from sparkctl.policy.images import Measurement, Retrial, parse_ref, plan_retest, retest_tag, retestable
from sparkctl.spec.engine import Image
from sparkctl.spec.load import Catalog
from sparkctl.spec.models import Stack

TRIAL_SUFFIX = ".retest"


@dataclass(frozen=True)
class Trial:
    stack: Stack  # as its file says: its expectations judge the trial
    spec: Stack  # the trial itself: its own name, the banned tag at the digest measured
    retrial: Retrial


def trial_name(stack: str) -> str:
    return f"{stack}{TRIAL_SUFFIX}"


def measured_stack(name: str) -> str | None:
    """The stack a trial of this name measured, or None if it is no trial."""
    return name.removesuffix(TRIAL_SUFFIX) if name.endswith(TRIAL_SUFFIX) else None


def reported_spec(catalog: Catalog, name: str) -> Stack:
    """The spec a benchmark run of `name` ran with: a stack of the catalog, or for a retest's
    trial the stack it measured, under the trial's name (reports key their configs by name)."""
    measured = measured_stack(name)
    if measured is None:
        return catalog.stack(name)
    return catalog.stack(measured).model_copy(update={"name": name})


def choose_stack(catalog: Catalog, ref: str, wanted: str | None = None) -> Stack:
    """The stack to measure `ref` with: `wanted`, else the stack whose image repository it is (of
    several, the one the others extend)."""
    if wanted:
        return catalog.stack(wanted)
    repository = retest_tag(ref).repository
    users = [s for s in catalog.deployable() if parse_ref(s.image.ref).repository == repository]
    roots = [s for s in users if s.extends not in {u.name for u in users}]
    if len(roots) == 1:
        return roots[0]
    if not users:
        raise SparkctlError(f"no stack runs {repository}, so none says how to measure {ref}; name one with "
                            "`--stack NAME` (its model, flags and expectations are used)")
    raise SparkctlError(f"{len(roots)} stacks run {repository} ({', '.join(s.name for s in roots)}); choose the "
                        f"one to measure {ref} with `--stack NAME`")


def trial_spec(stack: Stack, retrial: Retrial) -> Stack:
    """The stack at the retested digest, under the trial's name. Its canary has no acceptance
    floor: the gate judges acceptance over the whole benchmark, so a broken image is measured
    (acceptance and load both) rather than only stopped at the canary."""
    image = Image(repository=retrial.name.repository, tag=retrial.name.tag, digest=retrial.digest,
                  allow_latest=True)
    expectations = stack.expectations.model_copy(update={"min_acceptance": None})
    return stack.model_copy(update={"name": trial_name(stack.name), "image": image, "expectations": expectations})


def prepare(ref: str, *, stack: str | None, force: bool, deployer: Deployer) -> Trial:
    """Choose the stack, resolve the tag on its registry now, decide (refusing an unchanged
    digest unless `force`), and make sure nothing else of this instance runs."""
    chosen = choose_stack(deployer.catalog, ref, stack)
    name = retestable(deployer.policy, ref)  # before the registry is asked
    try:
        digest = deployer.docker.registry_digest(name.tagged, mirrors=deployer.settings.registry_mirrors)
    except SparkctlError as e:
        raise SparkctlError(f"cannot resolve {name.tagged} on its registry, so there is nothing to measure: {e}") \
            from None
    retrial = plan_retest(deployer.policy, ref, digest, force=force)
    _alone(deployer, trial_name(chosen.name))
    return Trial(chosen, trial_spec(chosen, retrial), retrial)


def run(trial: Trial, deployer: Deployer) -> RetestDone:
    """Deploy the trial, benchmark it, judge it, record the verdict in the image policy; the trial's
    container is removed afterwards whatever happened."""
    name, retrial = trial.spec.name, trial.retrial
    catalog = dataclasses.replace(deployer.catalog, stacks={**deployer.catalog.stacks, name: trial.spec})
    lifted = dataclasses.replace(deployer, catalog=catalog, policy=deployer.policy.without(retrial.lift))
    deployer.reporter.note(name, f"measuring {retrial.name.tagged} at {retrial.digest} with {trial.stack.name}'s "
                                 "flags and gate, alone (not desired, not routed; removed afterwards)")
    lifted.down(name)  # what a killed retest left
    try:
        result = _measure(trial, lifted)
        return _record(trial, result, lifted)
    finally:
        lifted.down(name)
        deployer.reporter.note(name, "trial removed")


def _alone(deployer: Deployer, trial: str) -> None:
    running = sorted({c.stack for c in deployer.docker.containers() if c.running and c.stack != trial})
    if running:
        verb, them = ("is", "it") if len(running) == 1 else ("are", "them")
        raise SparkctlError(f"a retest measures the image with the machine to itself, but {', '.join(running)} "
                            f"{verb} running in this instance: `sparkctl down` {them} first, and `sparkctl up` "
                            f"{them} again after the retest")


def _measure(trial: Trial, deployer: Deployer) -> RetestDone:
    name, retrial, store = trial.spec.name, trial.retrial, deployer.store
    base = RetestDone(retrial.name.tagged, trial.stack.name, retrial.digest, False, "", None, None)
    try:
        deployer.up(name)
    except HealthError as e:  # the image itself failed to serve: that is a measurement too
        latest = store.deployments.latest(name)
        deployment = latest.id if latest else None
        return dataclasses.replace(base, verdict=f"fail: {str(e).splitlines()[0]} (deployment {deployment})",
                                   deployment=deployment)
    trial_deployment = store.deployments.latest(name)
    profile = requalifying(trial.stack.expectations, cap=trial.stack.max_concurrency)
    bench = bench_stack.benchmark(trial.spec, settings=deployer.settings, store=store, profile=profile,
                                  docker=deployer.docker, on_progress=_announcer(deployer, name))
    verdict = judge(bench, trial.stack.expectations, baseline=store.bench.known_good(trial.stack.name),
                    up_to=max(profile.concurrency))
    store.bench.judge(bench.id, verdict.describe())
    verdicts, checked = [verdict], None
    if trial.stack.expectations.quality is not None:  # its quality gate too, at the engine (nothing routes a trial)
        deployer.reporter.note(name, f"quality: {trial.stack.expectations.quality.task} with lm-eval")
        checked, judged = quality.assess(trial.spec, settings=deployer.settings, store=store, via_gateway=False,
                                         baseline_of=trial.stack.name)
        verdicts.append(judged)
    failed = [v.describe() for v in verdicts if not v.passed]
    return dataclasses.replace(base, passed=not failed, verdict="; ".join(failed) or "pass", run=bench.id,
                               deployment=trial_deployment.id if trial_deployment else None, rows=_rows(bench.rows),
                               quality_run=checked.id if checked else None,
                               quality=checked.summary() if checked else "")


def _record(trial: Trial, result: RetestDone, deployer: Deployer) -> RetestDone:
    retrial, images, events = trial.retrial, deployer.store.images, deployer.store.events
    tagged = retrial.name.tagged
    if result.passed:
        also = f" and quality run {result.quality_run} passed its quality gate" if result.quality_run else ""
        images.requalify(lift=retrial.lift, ref=tagged, digest=retrial.digest,
                         provenance=f"retest with {trial.stack.name}: benchmark run {result.run} passed its gate{also}")
        events.record(trial.stack.name, "requalified", f"{tagged} at {retrial.digest}: run {result.run} passed")
        return dataclasses.replace(result, lifted=retrial.lift)
    measurement = Measurement(date=dt.date.today(), digest=retrial.digest, verdict=result.verdict, run=result.run,
                              deployment=result.deployment)
    recorded = images.record_retest(retrial.key, measurement)
    events.record(trial.stack.name, "retest_failed", f"{tagged} at {retrial.digest}: {result.verdict}")
    return dataclasses.replace(result, recorded=recorded)


def _announcer(deployer: Deployer, name: str):
    """Benchmark progress as one note per test (depth and concurrency) as it starts."""
    seen: set[tuple[int, int]] = set()

    def announce(progress: Progress) -> None:
        test = (progress.depth, progress.concurrency)
        if test not in seen:
            seen.add(test)
            deployer.reporter.note(name, f"benchmark: depth {test[0]}, {test[1]} concurrent request(s)")

    return announce


def _rows(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """What the CLI shows of each benchmark row."""
    keys = ("depth", "concurrency", "tg_tps", "acceptance", "failed")
    return tuple({k: r.get(k) for k in keys} for r in rows)
