"""Benchmark a deployed stack and keep the result: the run is stored with the deployment's
fingerprint and parts (image digest, model and draft commits, patch-set hash) and its folder
under the state dir (`bench/<run id>/`), with the environment it ran in (`environment.json`:
the engine's image and the command line its container runs, read from Docker when a handle is
given, else rendered from the spec). The gate's verdict is recorded on the run; a pass makes
it the stack's last known-good run and pins its image digest as known-good (provenance: the run).
A failure tied to a digest that never passed blacklists that digest with the measured reason.
Used by `sparkctl bench run`, the switch-over hook, the sweep.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.adapters.hub import repo_folder
from sparkctl.bench import environment, runner
from sparkctl.bench.gate import Verdict, judge
from sparkctl.bench.profiles import PROFILES, Profile
from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.spec.render import vllm_args
from sparkctl.state.bench import BenchRun
from sparkctl.state.store import Store

if TYPE_CHECKING:
    from sparkctl.adapters.docker import DockerEngine


def benchmark(stack: Stack, *, settings: Settings, store: Store, via_gateway: bool = False,
              profile: Profile | None = None, skip_coherence: bool = False, docker: DockerEngine | None = None,
              on_progress: Callable[[runner.Progress], None] | None = None) -> BenchRun:
    """Run `profile` (default: the stack's) against the running stack: at its engine, or through the
    gateway (so its concurrency cap holds while agents use it too). The corpus comes from the
    settings; the coherence check is skipped when asked here or in the settings."""
    deployment = store.deployments.latest(stack.name)
    if deployment is None or deployment.phase is not Phase.RUNNING:
        raise SparkctlError(f"{stack.name} is not running: `sparkctl up {stack.name}` first")
    profile = profile or PROFILES[stack.bench_profile]
    if profile.prefix_cached and stack.vllm and stack.vllm.enable_prefix_caching is False:
        raise SparkctlError(f"{stack.name} runs with prefix caching off (vllm.enable_prefix_caching: false), so "
                            f"profile {profile.name} would measure no cache: run it on a stack that caches "
                            "(vLLM's default; seed 000 kept it off, as it hung with the DSpark draft)")
    engine = stack.url
    gateway = settings.gateway_url
    keys = [k.get_secret_value() for k in settings.gateway_api_keys]
    target = runner.Target(base_url=f"{gateway if via_gateway else engine}/v1", model=stack.served_name,
                           tokenizer=tokenizer_dir(stack, deployment.parts, settings), metrics_url=f"{engine}/metrics",
                           max_model_len=stack.vllm.max_model_len if stack.vllm else None,
                           api_key=keys[0] if via_gateway and keys else None)
    run_id = store.bench.begin(stack.name, deployment.fingerprint, deployment.parts, profile.name)
    folder = settings.state_dir / "bench" / str(run_id)
    try:
        method = runner.Method(corpus=settings.bench_corpus,
                               skip_coherence=skip_coherence or settings.bench_skip_coherence)
        rows = runner.run(target, profile, folder=folder, method=method, on_progress=on_progress,
                          engine=engine_facts(stack, deployment.parts, docker))
    except SparkctlError as e:
        store.bench.finish(run_id, folder=str(folder), rows=[], error=str(e))
        raise
    store.bench.finish(run_id, folder=str(folder), rows=[asdict(r) for r in rows])
    found = store.bench.run(run_id)
    assert found is not None
    return found


def gate(stack: Stack, run: BenchRun, *, store: Store, pin: bool = True) -> Verdict:
    """Judge `run` against the stack's expectations and its last known-good run; record the verdict.
    A pass makes it known-good, unless `pin` is False (another gate is still to pass: `pin` later)."""
    verdict = judge(run, stack.expectations, baseline=store.bench.known_good(stack.name))
    store.bench.judge(run.id, verdict.describe())
    if verdict.passed and pin:
        known_good(stack, run, store=store)
    return verdict


def known_good(stack: Stack, run: BenchRun, *, store: Store) -> None:
    """`run` passed: it becomes the stack's known-good run, and its image digest is pinned known-good."""
    digest = run.parts.get("image", "")
    if digest.startswith("sha256:"):
        store.bench.mark_known_good(stack.name, run.id, digest)
        store.images.pin(stack.image.ref, digest=digest, known_good=True,
                         provenance=f"benchmark run {run.id} passed its gate")


def blacklist_if_new(stack: Stack, digest: str, reason: str, *, store: Store) -> bool:
    """Blacklist `digest` for `reason` unless it is the stack's known-good image; True if it was."""
    good = store.bench.known_good(stack.name)
    if not digest.startswith("sha256:") or (good is not None and good.parts.get("image") == digest):
        return False
    store.images.blacklist(digest, reason=f"{stack.image.ref}: {reason}")
    return True


def engine_facts(stack: Stack, parts: dict[str, str], docker: DockerEngine | None) -> environment.Engine:
    """What serves the stack, for the run's environment: its image (with the deployment's digest)
    and the command line of its running container, or the flags its spec renders to."""
    digest = parts.get("image", "")
    image = stack.image.ref if stack.image.digest or not digest.startswith("sha256:") else f"{stack.image.ref}@{digest}"
    spec_flags = shlex.join(vllm_args(stack)) if stack.vllm is not None else None
    return environment.Engine(stack.served_name, url=stack.url, metrics_url=f"{stack.url}/metrics", image=image,
                              flags=_container_command(stack, docker) or spec_flags)


def _container_command(stack: Stack, docker: DockerEngine | None) -> str | None:
    if docker is None:
        return None
    try:
        running = [c for c in docker.containers(stack.name) if c.running]
        command = docker.inspect(running[0].id).command if running else ()
    except SparkctlError:
        return None
    return shlex.join(command) if command else None


def tokenizer_dir(stack: Stack, parts: dict[str, str], settings: Settings) -> Path:
    """The model's downloaded files (tokenizer.json), as the deployment fetched them."""
    if stack.model is None:
        raise SparkctlError(f"{stack.name} names no model, so there is no tokenizer to benchmark with")
    if stack.model.path:
        return Path(stack.model.path)
    assert stack.model.repo is not None
    return repo_folder(settings.hf_cache_dir, stack.model.repo) / "snapshots" / parts["model"]
