"""The engine's start, once a stack is prepared: its container created (gated, for a staged
switch), started and health-checked, with the stack's previous container set aside meanwhile and
restarted if the new one fails; or its compose project brought up. Every bind either gets is
judged first as this host resolves it (`binds.py`). `Deployer` (pipeline.py) owns the flow
around it: checks, admission, preparation, the record."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl import instance as instances
from sparkctl.adapters.docker import DockerEngine
from sparkctl.container import LABEL_MEMORY, LABEL_STACK, Container
from sparkctl.deploy import binds, health, image, patches, weights
from sparkctl.deploy.memory import GIB, folder_bytes, kv_plan, usable_memory
from sparkctl.deploy.progress import Reporter
from sparkctl.deploy.record import Phases
from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase
from sparkctl.policy.headroom import Headroom
from sparkctl.policy.images import ImagePolicy
from sparkctl.policy.parking import sleep_refusal
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.spec.ranks import Rank
from sparkctl.spec.render import Sources, render, spec_hash

if TYPE_CHECKING:
    from sparkctl.adapters.compose import ComposeProject
    from sparkctl.state.images import ImageRecords


@dataclass(frozen=True)
class UpResult:
    stack: str
    fingerprint: str
    changed: bool  # False: the running container already matched, nothing was touched
    url: str
    acceptance: float | None = None
    timings: dict[str, float] = field(default_factory=dict)  # engine start, health, canary (Phases.durations)
    headroom: Headroom | None = None  # the engine's KV headroom (None: it reported no KV-cache size)
    watched: tuple[str, str] | None = None  # (where the registry is asked, the tag) whether the image moved


@dataclass(frozen=True)
class Prepared:
    """Everything fetched and checked before a container is touched."""

    image: image.ResolvedImage
    model: weights.FetchedWeights | None
    draft: weights.FetchedWeights | None
    patches: patches.PatchResult
    fingerprint: str
    parts: dict[str, str]


@dataclass(frozen=True)
class Staged:
    """A deployment prepared ahead of its start (`Deployer.stage`)."""

    stack: str
    deployment: int
    prepared: Prepared
    container: str | None  # started, its engine behind a gate (None: the stack had containers, or is compose)
    sleep: bool  # the container was created with sleep mode


@dataclass(frozen=True)
class Launch:
    """Starts a prepared stack's engine for `Deployer`, built with the deployer's adapters."""

    settings: Settings
    policy: ImagePolicy
    images: ImageRecords  # where what it learns of an image is recorded
    docker: DockerEngine
    reporter: Reporter
    placed: bool  # run by a fleet host's agent: its containers are labelled the fleet's
    rank: Rank | None  # one rank of a multi-node group, on this host

    def container(self, stack: Stack, prepared: Prepared, phases: Phases, staged: Staged | None = None
                  ) -> UpResult:
        """The stack's container started and healthy (the one `staged` created, else a new one);
        the previous one set aside meanwhile, removed after, restarted if the new one fails."""
        url = stack.url
        created = staged.container if staged else None
        current = [] if created else self.docker.containers(stack.name)  # staged: it had none
        if any(c.running and c.fingerprint == prepared.fingerprint and c.spec_hash == spec_hash(stack)
               for c in current):
            self.reporter.note(stack.name, f"{stack.name} is already running with fingerprint "
                                           f"{prepared.fingerprint}: nothing to do")
            return UpResult(stack.name, prepared.fingerprint, False, url)
        previous = self._set_aside(current)
        sleep = staged.sleep if created else self.sleeps(stack, prepared)
        try:
            try:
                rate = self._start(stack, prepared, phases, sleep=sleep, created=created)
            except health.HealthError as e:
                if not (sleep and NO_SLEEP_MODE in str(e)):
                    raise
                self._without_sleep_mode(stack, prepared.image.digest)
                rate = self._start(stack, prepared, phases, sleep=False)
        except SparkctlError:
            self._restore(previous, stack)
            raise
        for c in previous:
            self.docker.remove(c)
        return UpResult(stack.name, prepared.fingerprint, True, url, rate)

    def check_paths(self, stack: Stack) -> None:
        """The host paths the stack file names, judged before anything is fetched (`create`
        judges every mount of the container again, resolved, just before it exists)."""
        weights = [("model.path", stack.model), ("draft.path", stack.draft)]
        paths = [(where, w.path) for where, w in weights if w is not None and w.path is not None]
        paths += [(f"container.mounts[{i}].source", m.source) for i, m in enumerate(stack.container.mounts)]
        for where, path in paths:
            binds.judge(path, where=where, owned=self.owned(stack), allow=stack.allow)

    def owned(self, stack: Stack) -> tuple[Path, ...]:
        """The host folders sparkctl owns for `stack`, which it mounts without an `allow:`."""
        return self.settings.hf_cache_dir, self.settings.overlays_dir, self._compile_cache_dir(stack)

    def sleeps(self, stack: Stack, prepared: Prepared) -> bool:
        """Whether the engine starts with sleep mode: the stack may park, its image wakes, and a
        wake of its KV region is within GB10's bound (otherwise it runs as the seeds ran it)."""
        return (stack.sleeps and not self.policy.wake_refused(prepared.image.digest)
                and sleep_refusal(stack.name, kv_bytes=self.kv_bytes(stack, prepared),
                                  kv_limit=int(self.settings.wake_kv_max_gib * GIB)) is None)

    def kv_bytes(self, stack: Stack, prepared: Prepared) -> int | None:
        """The KV cache the engine is given (None: vLLM sizes it, `resources.kv_cache: engine`)."""
        weights = sum(folder_bytes(w.path) for w in (prepared.model, prepared.draft) if w is not None)
        return kv_plan(stack, self.settings, weights=weights,
                       usable=usable_memory(self.settings, engines_running=True))

    def create(self, stack: Stack, prepared: Prepared, *, sleep: bool, gated: bool = False) -> str:
        """Create (not start) the engine container; its name. `gated`: its engine waits for
        `open_gate` once the container runs."""
        plan = render(stack, self._sources(stack, prepared), image=prepared.image.run_ref,
                      fingerprint=prepared.fingerprint, gpus=self._gpus(), env=self.settings.engine_env,
                      instance=self.settings.instance, sleep=sleep, placed=self.placed, rank=self.rank,
                      kv_cache_bytes=self.kv_bytes(stack, prepared))
        plan = replace(plan, mounts=binds.checked(plan.mounts, owned=self.owned(stack), allow=stack.allow))
        if gated:
            plan = plan.gated(self.docker.entrypoint(plan.image))
        self.docker.create(plan)
        return plan.name

    def _start(self, stack: Stack, prepared: Prepared, phases: Phases, *, sleep: bool, created: str | None = None
               ) -> float | None:
        """Start the engine (in the container `stage` started, by opening its gate; else in a
        container created and started now); its health's acceptance rate. A container that
        fails is removed."""
        name = created or self.create(stack, prepared, sleep=sleep)
        try:
            if created:
                self.docker.open_gate(name)
            else:
                self.docker.start(name)
            if self.rank is not None and self.rank.headless:
                return health.wait_started(self._engine(name))
            return health.wait_healthy(stack, stack.url, self._engine(name), reporter=phases.health())
        except SparkctlError:
            self.docker.remove(name)
            raise

    def _without_sleep_mode(self, stack: Stack, digest: str) -> None:
        """The engine refused --enable-sleep-mode (vLLM's CPU platform does): learnt for the digest
        in the image policy's wake ledger, so its stacks run without it and park by stopping from now on."""
        reason = "its platform has no sleep mode (\"Sleep mode is not supported on current platform\")"
        self.images.record_wake(digest, ok=False, reason=reason)
        self.reporter.note(stack.name, f"image {digest} {reason}: started again without it; "
                                       f"{stack.name} will park by stopping")

    def compose(self, stack: Stack, prepared: Prepared, phases: Phases) -> UpResult:
        """The stack's compose project up (built from the prepared image) and healthy."""
        assert stack.compose is not None
        url = stack.url
        self.reporter.phase(stack.name, Phase.STARTING, f"docker compose up ({stack.compose.project})")
        project = self.project(stack, {**stack.compose.env, **self.variables(stack, prepared)})
        owned = (*self.owned(stack), self.settings.compose_dir / stack.compose.project)
        for service, source, target in project.binds():  # as compose will hand them to Docker
            binds.judge(source, where=f"compose project {stack.compose.project}, service {service}, volume at {target}",
                        owned=owned, allow=stack.allow)
        project.up()
        containers = project.container_ids()
        if not containers:
            raise SparkctlError(f"compose project {project.name} started no container for {stack.compose.service}")
        rate = health.wait_healthy(stack, url, self._engine(containers[0]), reporter=phases.health())
        return UpResult(stack.name, prepared.fingerprint, True, url, rate)

    def variables(self, stack: Stack, prepared: Prepared) -> dict[str, str]:
        """What sparkctl gives a compose project's variables (`engine.COMPOSE_VARIABLES`; the
        stack's `compose.env` may add others, never one of these)."""
        env = {"BASE_IMAGE": prepared.image.run_ref, "IMAGE": f"sparkctl/{stack.name}:{prepared.fingerprint}",
               "FINGERPRINT": prepared.fingerprint, "HOST": "127.0.0.1", "PORT": str(stack.port),
               "HF_HUB_OFFLINE": "1", "SERVED_MODEL_NAME": stack.served_name,
               "HF_HUB_CACHE_DIR": str(self.settings.hf_cache_dir), "COMPILE_CACHE": str(self._compile_cache(stack)),
               "GPU_MEMORY_UTILIZATION": f"{stack.resources.gpu_memory_utilization:g}"}
        if stack.model and stack.model.repo:
            env["MODEL_ID"] = stack.model.repo
        return env

    def project(self, stack: Stack, env: dict[str, str]) -> ComposeProject:
        """The stack's compose project, with `env` for its variables."""
        from sparkctl.adapters.compose import ComposeProject  # python-on-whales only when needed

        assert stack.compose is not None
        instance = self.settings.instance
        return ComposeProject(self.settings.compose_dir / stack.compose.project,
                              name=instances.container_name(stack.name, instance), service=stack.compose.service,
                              variables=env, engine_env=self.settings.engine_env, gpus=self._gpus(),
                              labels={LABEL_STACK: stack.name, instances.LABEL: instance,
                                      LABEL_MEMORY: f"{stack.resources.gpu_memory_utilization:g}"},
                              work_dir=self.settings.state_dir / "compose" / stack.name,
                              docker_host=self.docker.base_url)  # the same endpoint as the handle

    def _sources(self, stack: Stack, prepared: Prepared) -> Sources:
        assert prepared.model is not None
        model, draft = prepared.model, prepared.draft
        return Sources(model_dir=str(model.mount), model_subpath=model.subpath,
                       draft_dir=str(draft.mount) if draft else None, draft_subpath=draft.subpath if draft else "",
                       overlays=prepared.patches.mounts,
                       compile_cache_dir=str(self._compile_cache(stack)) if stack.container.compile_cache else None)

    def _compile_cache(self, stack: Stack) -> Path:
        path = self._compile_cache_dir(stack)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _compile_cache_dir(self, stack: Stack) -> Path:
        return self.settings.state_dir / "compile-cache" / stack.name

    def _set_aside(self, containers: list[Container]) -> list[str]:
        """Stop the stack's current containers and move them out of the way of the new name."""
        aside = []
        for c in containers:
            new_name = f"{c.name}-previous-{c.id[:8]}"
            if c.running:
                self.docker.stop(c.id)
            self.docker.rename(c.id, new_name)
            aside.append(new_name)
        return aside

    def _restore(self, previous: list[str], stack: Stack) -> None:
        for name in previous[:1]:
            self.docker.rename(name, instances.container_name(stack.name, self.settings.instance))
            self.docker.start(instances.container_name(stack.name, self.settings.instance))
            self.reporter.note(stack.name, "the previous deployment was restarted")

    def _engine(self, container: str) -> health.Engine:
        return health.Engine(inspect=lambda: self.docker.inspect(container),
                             logs=lambda n: self.docker.logs(container, tail=n))

    def _gpus(self) -> bool:
        if self.settings.gpus == "auto":
            return "nvidia" in self.docker.facts().runtimes
        return self.settings.gpus == "all"


NO_SLEEP_MODE = "Sleep mode is not supported on current platform"  # vLLM's words on CPU
