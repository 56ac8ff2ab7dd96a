"""`sparkctl up` and `down`: resolve -> image -> weights -> patches -> container -> health.

Every failure before the container step leaves the machine as it was. Past it, the engine's start
(`launch.py`) only stops (and renames) the stack's previous container while the new one starts,
and restarts it if the new one fails its health phases, so a failed deploy leaves the previous state
running. A hold/swap switch splits the deploy in two: `stage` (checked, prepared, the container
created, nothing started) while the old stack still serves, then `up(staged=...)` (admission,
start, health) once the old one has made room. Built by `wiring.py` with its adapters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import cached_property

from sparkctl.adapters.docker import DockerEngine
from sparkctl.adapters.hub import HubClient
from sparkctl.deploy import capacity, image, patches, weights
from sparkctl.deploy.launch import Launch, Prepared, Staged, UpResult
from sparkctl.deploy.memory import MemoryView
from sparkctl.deploy.progress import Reporter, Stoppable, Stopped
from sparkctl.deploy.record import Phases
from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase
from sparkctl.policy.admission import admit
from sparkctl.policy.headroom import Headroom
from sparkctl.policy.images import ImagePolicy, check
from sparkctl.settings import Settings
from sparkctl.spec.load import Catalog
from sparkctl.spec.models import Kind, Stack
from sparkctl.spec.ranks import Rank
from sparkctl.spec.render import spec_hash
from sparkctl.state.store import Store


@dataclass
class Deployer:
    settings: Settings
    catalog: Catalog
    policy: ImagePolicy
    docker: DockerEngine
    hub: HubClient
    store: Store
    reporter: Reporter
    placed: bool = False  # run by a fleet host's agent: its containers are labelled the fleet's
    rank: Rank | None = None  # one rank of a multi-node group (`parallel`), on this host
    parked: Callable[[], Mapping[str, int]] = dict  # the parked stacks and their levels, from whoever owns them

    @cached_property
    def launch(self) -> Launch:
        return Launch(self.settings, self.policy, self.store.images, self.docker, self.reporter, placed=self.placed,
                      rank=self.rank)

    def up(self, name: str, *, refresh: bool = False, replace: bool = False, staged: Staged | None = None,
           stop: threading.Event | None = None) -> UpResult:
        """Deploy the stack; `staged` (from `stage`) has been prepared and started already, and
        only its admission is left before its engine starts; `stop`: see `prepare`. An unchanged
        stack is found so by the engine step: its running container has the fingerprint of what
        was just prepared."""
        stack = self.catalog.stack(name)
        deployment = staged.deployment if staged else self.store.deployments.begin(name)
        phases = Phases(self.store, self.reporter, stack.name, deployment)
        prepared = staged.prepared if staged else None
        try:
            if staged is None:
                self._check(stack)
            room = self._admit(stack, replace=replace)
            prepared = prepared or self.prepare(stack, deployment, refresh=refresh, stop=stop)
            for other in room:  # only once everything else checked out (a refused image stops nothing)
                self.reporter.note(stack.name, f"stopping {other} to make room (--replace)")
                for c in self.docker.containers(other):
                    self.docker.remove(c.id)
            self.store.deployments.set_fingerprint(deployment, prepared.fingerprint, prepared.parts)
            if stack.kind is Kind.COMPOSE:
                result = self.launch.compose(stack, prepared, phases)
            else:
                result = self.launch.container(stack, prepared, phases, staged)
        except SparkctlError as e:
            if staged is not None and staged.container:  # e.g. refused by admission: never started
                self.docker.remove(staged.container)
            phases.enter(Phase.FAILED, error=str(e))
            raise
        finally:
            if prepared is not None:
                prepared.image.settle()  # the moved-tag note comes before the outcome
        phases.enter(Phase.RUNNING, "unchanged" if not result.changed else "")
        headroom = (self._headroom(stack, deployment) if result.changed
                    else self.store.deployments.headroom(stack.name, result.fingerprint))
        watched = (prepared.image.source, prepared.image.name.tagged) if prepared.image.source else None
        return dataclasses.replace(result, timings=phases.durations(), headroom=headroom,  # `replace`: a flag here
                                   watched=watched)

    def stage(self, name: str) -> Staged:
        """The part of `up` that holds no engine memory: checked, prepared, and (for a container
        stack that has none yet) its container started with the engine behind a gate
        (`ContainerPlan.gated`). A hold/swap switch stages the new stack while the old one still
        serves, so that its hold is left with the old one's stop and the new one's admission,
        engine start and health; `up(staged=...)` does those, `discard` undoes this."""
        stack = self.catalog.stack(name)
        deployment = self.store.deployments.begin(name)
        phases = Phases(self.store, self.reporter, stack.name, deployment)
        container = None
        try:
            self._check(stack)
            prepared = self.prepare(stack, deployment)
            sleep = self.launch.sleeps(stack, prepared)
            fresh = stack.kind is not Kind.COMPOSE and not self.docker.containers(stack.name)
            container = self.launch.create(stack, prepared, sleep=sleep, gated=True) if fresh else None
            if container:
                self.docker.start(container)
        except SparkctlError as e:
            if container:
                self.docker.remove(container)
            phases.enter(Phase.FAILED, error=str(e))
            raise
        return Staged(stack.name, deployment, prepared, container, sleep)

    def fetch(self, name: str, *, refresh: bool = False, stop: threading.Event | None = None) -> Prepared:
        """`sparkctl pull`: everything `up` would fetch and patch, recorded as a `fetched`
        deployment; nothing starts, so a later `up` (or a switch to it) waits only for the engine."""
        stack = self.catalog.stack(name)
        deployment = self.store.deployments.begin(name)
        phases = Phases(self.store, self.reporter, stack.name, deployment)
        try:
            self._check(stack)
            prepared = self.prepare(stack, deployment, refresh=refresh, stop=stop)
        except SparkctlError as e:
            phases.enter(Phase.FAILED, error=str(e))
            raise
        prepared.image.settle()  # the moved-tag note comes before the outcome
        self.store.deployments.set_fingerprint(deployment, prepared.fingerprint, prepared.parts)
        phases.enter(Phase.FETCHED, "image, weights and patches here; nothing started")
        return prepared

    def discard(self, staged: Staged, why: str) -> None:
        """A staged deployment that will not start: its container removed, the deployment failed."""
        if staged.container:
            self.docker.remove(staged.container)
        self.store.deployments.advance(staged.deployment, Phase.FAILED, error=why)

    def _check(self, stack: Stack) -> None:
        """What refuses a stack before anything is fetched: its kind here, its image's tag, its host paths."""
        if stack.parallel is not None and self.rank is None:
            raise SparkctlError(f"{stack.name} is a multi-node stack ({stack.parallel.nodes} ranks): it runs across a "
                                f"fleet, with `sparkctl fleet up {stack.name}` on the fleet's head")
        check(self.policy, stack.image.ref, allow_latest=stack.image.allow_latest)  # a refused tag says so first
        self.launch.check_paths(stack)  # the host folders it names, as this host resolves them
        for _, why in stack.risks():  # opted into with `allow:`
            self.reporter.note(stack.name, f"warning: {why}")

    def prepare(self, stack: Stack, deployment: int | None = None, *, refresh: bool = False,
                stop: threading.Event | None = None) -> Prepared:
        """Resolve and fetch everything the stack needs, and patch; starts nothing. `stop` set
        while it fetches (a `down`, a cancel, the daemon's stop) ends every fetch stream."""
        phases = Phases(self.store, self.reporter, stack.name, deployment)
        phases.enter(Phase.RESOLVING)
        resolved = image.resolve(stack, policy=self.policy, docker=self.docker, store=self.store,
                                 mirrors=self.settings.registry_mirrors, refresh=refresh, reporter=self.reporter)
        model, draft = self._fetch(stack, resolved, phases, refresh=refresh, stop=stop or threading.Event())
        self.store.digests.record(resolved.name.tagged, resolved.digest)
        self._settle_pin(stack, resolved)
        phases.enter(Phase.PATCHING)
        sources = {k: w.path for k, w in (("model", model), ("draft", draft)) if w is not None}
        patched = patches.prepare([self.catalog.patch_sets[p] for p in stack.patches], image=resolved.run_ref,
                                  digest=resolved.digest, docker=self.docker, sources=sources,
                                  state_dir=self.settings.state_dir, overlays_dir=self.settings.overlays_dir,
                                  patches_dir=self.settings.patches_dir)
        parts = {"image": resolved.digest, "model": model.commit if model else "",
                 "draft": draft.commit if draft else "", "patches": patched.hash, "spec": spec_hash(stack),
                 "env": json.dumps(self.settings.engine_env, sort_keys=True)}
        fingerprint = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
        return Prepared(resolved, model, draft, patched, fingerprint, parts)

    def _fetch(self, stack: Stack, resolved: image.ResolvedImage, phases: Phases, *, refresh: bool,
               stop: threading.Event) -> tuple[weights.FetchedWeights | None, weights.FetchedWeights | None]:
        """The image, the model and the draft fetched at once: the registry and the Hub are other
        servers, a pull's extraction is bound by one core and a download by the network. The phase
        is `pulling` until the image is here, then `fetching` until the weights are. The first
        stream to fail (or a set `stop`) ends the others at their next progress; the next `up`
        fetches only what is missing (Docker keeps the layers that arrived, the Hub cache the files
        that arrived whole; huggingface_hub 2 keeps no partial file)."""
        reporter = Stoppable(self.reporter, stop, why="stopped: another fetch failed, or the deploy was stopped")
        phases.enter(Phase.PULLING, ", ".join([resolved.run_ref, *(w.repo or w.path or "" for w in
                                                                   (stack.model, stack.draft) if w)]) + " at once")
        with ThreadPoolExecutor(3, thread_name_prefix="fetch") as pool:
            pulled = pool.submit(image.pull, resolved, stack=stack.name, docker=self.docker, reporter=reporter)
            fetched = [pool.submit(weights.fetch, w, hub=self.hub, store=self.store, refresh=refresh, reporter=reporter,
                                   stack=stack.name, label=label) if w else None
                       for w, label in ((stack.model, "model"), (stack.draft, "draft"))]
            streams = [f for f in (pulled, *fetched) if f is not None]
            pending = set(streams)
            try:
                while pending and not stop.is_set():
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    if any(f.exception() for f in done):
                        break
                    if pulled in done:
                        phases.enter(Phase.FETCHING)
            finally:
                stop.set()  # the others end at their next progress; leaving the pool waits for them
        failed = [e for f in streams if (e := f.exception())]
        if cause := [e for e in failed if not isinstance(e, Stopped)]:  # in stream order, each said
            raise cause[0] if len(cause) == 1 else SparkctlError("; ".join(str(e) for e in cause))
        if failed:  # stopped from outside (a `down`, a Ctrl-C, the daemon's stop): every stream said so
            raise failed[0]
        return fetched[0].result() if fetched[0] else None, fetched[1].result() if fetched[1] else None

    def down(self, name: str) -> int:
        """Stop and remove the stack's containers (state and pins are kept); how many went."""
        stack = self.catalog.stack(name)
        if stack.kind is Kind.COMPOSE:
            self.launch.project(stack, {}).down()
        removed = [self.docker.remove(c.id) for c in self.docker.containers(name)]
        latest = self.store.deployments.latest(name)
        if latest is not None and latest.phase is Phase.RUNNING:
            self.store.deployments.advance(latest.id, Phase.STOPPED, "sparkctl down")
        return len(removed)

    def _settle_pin(self, stack: Stack, resolved: image.ResolvedImage) -> None:
        """A pin without a digest (a tag known good whose digest was never published) takes the
        digest this first deploy resolved from the registry; a local build pins nothing."""
        pin = self.policy.pin_for(resolved.name.tagged)
        if pin is None or pin.settled or resolved.run_ref == resolved.digest:
            return
        if self.store.images.settle_pin(resolved.name.tagged, digest=resolved.digest):
            self.reporter.note(stack.name, f"pinned {resolved.name.tagged} to {resolved.digest}, the digest its "
                                           "known-good tag names now (its pin had none)")

    def _headroom(self, stack: Stack, deployment: int) -> Headroom | None:
        """Read, record and show the running engine's KV headroom. Only shown: a deploy that
        passed its health checks stands whatever the engine says of its KV cache."""
        running = [c for c in self.docker.containers(stack.name) if c.running]
        try:
            if not running:
                raise SparkctlError("its container is gone")
            headroom = capacity.read(stack, stack.url, running[0].id, self.docker)
        except SparkctlError as e:
            unchecked = " (expectations.min_kv_tokens unchecked)" if stack.expectations.min_kv_tokens else ""
            self.reporter.note(stack.name, f"KV cache size unknown{unchecked}: {e}")
            return None
        self.store.deployments.set_headroom(deployment, headroom)
        self.reporter.note(stack.name, headroom.summary())
        for warning in headroom.warnings():
            self.reporter.note(stack.name, f"warning: {warning}")
        return headroom

    def _admit(self, stack: Stack, *, replace: bool) -> tuple[str, ...]:
        """The stacks to stop for this one to fit (with --replace); refuses if it doesn't fit otherwise."""
        held = MemoryView(self.settings, self.store, self.catalog, self.docker).held(self.parked())
        verdict = admit(stack.name, stack.resources.gpu_memory_utilization, held, ceiling=self.settings.memory_ceiling)
        if not verdict.fits and not replace:
            raise SparkctlError(verdict.explain(stack.name))
        return verdict.in_the_way
