"""The first `up` of a stack on a fresh Spark, whose image, model and draft all have to be fetched,
beside the sequential order's time. The registry and the Hub each answer through a loopback link
of a set rate (`tests/fakes/throttle.py`), so the figures are a link's, not loopback's. The image is
the sim's with one layer of random bytes on top, pushed to this run's own registry, so a pull has
that layer to fetch (the sim's own layers are on this machine already, as a Spark's CUDA base
would be after its first image).

Per link setting, each stream is first timed alone (a pull by digest through the Docker adapter,
a download of each repo through huggingface_hub), and the Hub's two at once (the model and the
draft come from one server, through one link), then `sparkctl up` runs on an empty HF cache and
an engine without the layer, and its phases are read from its deployment's record:
- the goal: up <= max(pull, the Hub's) + patching + the engine's start + 0.5 s, where the Hub's is
  the model and the draft at once through its link: the issue's max(pull, model, draft) would need
  a link per repo, but the model and the draft share the Hub's;
- the reference: the sequential order's time, pull + model + draft + patching + start.
Twice: the registry and the Hub on links of their own, then both on one shared link (one token
bucket). There no order can beat every byte at the link's rate (the floor printed instead of the
goal), and fetching at once can save only the time a pull spends extracting layers whose bytes are
not the last to arrive: the image here is one layer, so at once and the sequential order come out
alike.

Run with `make perf` (or `.venv/bin/python tests/perf/bench_first_up.py`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SMOKE, SPARKCTL, daemon, figure, load, world  # noqa: E402

from sparkctl.adapters.docker import DockerEngine  # noqa: E402
from sparkctl.phase import Phase  # noqa: E402
from sparkctl.state.store import Store  # noqa: E402
from tests.fakes.registry import SIM_IMAGE, Registry  # noqa: E402
from tests.fakes.repos import DSPARK_DRAFT, QWEN_NVFP4  # noqa: E402
from tests.fakes.throttle import Link  # noqa: E402

STACK, TAG = "qwen36-dflash", "aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix"
MB = 10**6
RATE = (200 if SMOKE else 40) * MB  # bytes/s of each link
LAYER, MODEL, DRAFT = (16, 16, 4) if SMOKE else (240, 240, 60)  # MB to fetch: the image's new layer, the weights


def main() -> None:
    print(load())
    docker = DockerEngine()
    with world() as (env, hub), tempfile.TemporaryDirectory(prefix="sparkctl-first-up-") as tmp:
        root = Path(tmp)
        hub.repos[QWEN_NVFP4].files["model-00002-of-00002.safetensors"] = bytes(MODEL * MB)
        hub.repos[DSPARK_DRAFT].files["model-extra.safetensors"] = bytes(DRAFT * MB)
        registry = Registry(root / "registry")
        try:
            digest = publish(docker, registry)
            for shared in (False, True):
                measure(docker, env, registry.host, env["PERF_HUB"], digest, shared=shared)
        finally:
            registry.proc.terminate()
            registry.proc.wait(10)


def publish(docker: DockerEngine, registry: Registry) -> str:
    """The sim image with LAYER MB of random bytes on top, in `registry` under the stack's tag; the
    local build removed, so only a pull brings that layer back."""
    built = f"sparkctl-perf/first-up:{time.time_ns()}"
    subprocess.run(["docker", "build", "-q", "--network", "host", "-t", built, "-"], check=True, capture_output=True,
                   text=True, env={**os.environ, "DOCKER_BUILDKIT": "0"},  # no build cache keeps the layer
                   input=f"FROM {SIM_IMAGE}\nRUN head -c {LAYER * MB} /dev/urandom > /perf-layer\n")
    try:
        return registry.push(built, TAG)
    finally:
        subprocess.run(["docker", "rmi", "-f", built], check=True, capture_output=True)


def measure(docker: DockerEngine, env: dict[str, str], registry: str, hub: str, digest: str, *, shared: bool) -> None:
    hub = hub.removeprefix("http://")
    links = [Link(RATE, registry, hub)] if shared else [Link(RATE, registry), Link(RATE, hub)]
    via_registry, via_hub = (host for link in links for host in link.hosts)
    name = "one shared link" if shared else "links of their own"
    try:
        via = {**env, "SPARKCTL_REGISTRY_MIRRORS": f"ghcr.io={via_registry}", "SPARKCTL_HF_ENDPOINT": f"http://{via_hub}"}
        ref = f"{via_registry}/{TAG.rsplit(':', 1)[0]}"
        alone = {"pull": timed(lambda: docker.pull(ref, digest)),
                 "model": timed(lambda: download(via, QWEN_NVFP4)), "draft": timed(lambda: download(via, DSPARK_DRAFT))}
        with ThreadPoolExecutor(2) as both:  # the Hub's link: the model and the draft at once, as `up` fetches them
            hub_alone = timed(lambda: list(both.map(lambda repo: download(via, repo), (QWEN_NVFP4, DSPARK_DRAFT))))
        forget(docker, via, f"{ref}@{digest}")
        with daemon(via):
            started = time.monotonic()
            subprocess.run([SPARKCTL, "up", STACK], env=via, check=True, capture_output=True, text=True)
            took = time.monotonic() - started
            phases = record(via)
            subprocess.run([SPARKCTL, "down", STACK], env=via, check=True, capture_output=True, text=True)
        forget(docker, via, f"{ref}@{digest}")
    finally:
        for link in links:
            link.stop()
    rest = phases[Phase.RUNNING] - phases[Phase.PATCHING]  # patching, then the engine's start to serving
    sequential = sum(alone.values()) + rest
    key = "shared" if shared else "own"
    if shared:  # every byte through one link: no order beats the link's rate, and at once can save
        # only the time a pull spends extracting, where its layers' bytes are not the last to arrive
        against, bound = "floor (every byte at the link's rate)", (LAYER + MODEL + DRAFT) * MB / RATE
    else:
        against, bound = "goal max(pull, model and draft at once)", max(alone["pull"], hub_alone)
    limit = bound + rest + 0.5
    verdict = "(no order beats it)" if shared else f"({'met' if took <= limit else 'missed'})"
    print(f"first up, {name} at {RATE / MB:g} MB/s: {took:.2f} s; alone: pull {alone['pull']:.2f} s "
          f"({LAYER} MB), model {alone['model']:.2f} s ({MODEL} MB), draft {alone['draft']:.2f} s ({DRAFT} MB), "
          f"model and draft at once through the Hub's link {hub_alone:.2f} s; patching + start {rest:.2f} s\n"
          f"  {against} + patching + start + 0.5 = {limit:.2f} s: ratio {took / limit:.2f} {verdict}; "
          f"the sequential order {sequential:.2f} s: ratio {took / sequential:.2f}\n  up's phases: {durations(phases)}")
    figure(f"first_up_{key}_vs_{'floor' if shared else 'goal'}", took / limit, "ratio", sane=(0.2, 3.0),
           control=f"first_up_{key}_sequential")
    figure(f"first_up_{key}_sequential", sequential, "s", sane=(0.05, 600.0))
    figure(f"first_up_{key}_vs_sequential", took / sequential, "ratio", sane=(0.1, 3.0),
           control=f"first_up_{key}_sequential")


def durations(phases: dict[Phase, float]) -> str:
    at = list(phases.items())
    return ", ".join(f"{phase} {following[1] - entered:.2f} s" for (phase, entered), following in zip(at, at[1:],
                                                                                                    strict=False))


def timed(work) -> float:  # noqa: ANN001
    started = time.monotonic()
    work()
    return time.monotonic() - started


def download(env: dict[str, str], repo: str) -> None:
    """The repo through huggingface_hub alone (the same client and concurrency `up` uses), into a
    throwaway cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import disable_progress_bars

    from sparkctl.adapters.hub import WORKERS

    disable_progress_bars()
    with tempfile.TemporaryDirectory(prefix="sparkctl-first-up-hf-") as cache:
        snapshot_download(repo, cache_dir=cache, endpoint=env["SPARKCTL_HF_ENDPOINT"], max_workers=WORKERS)


def forget(docker: DockerEngine, env: dict[str, str], pulled: str) -> None:
    """A fresh Spark for the next `up`: the pulled image (so its new layer) and the HF cache gone."""
    subprocess.run(["docker", "rmi", "-f", pulled], capture_output=True)
    shutil.rmtree(env["SPARKCTL_HF_CACHE_DIR"], ignore_errors=True)


def record(env: dict[str, str]) -> dict[Phase, float]:
    """When the stack's last deployment entered each phase (seconds, the record's clock)."""
    store = Store(Path(env["SPARKCTL_STATE_DIR"]) / "sparkctl.db")
    return {phase: at for phase, at, _ in store.deployments.transitions(store.deployments.latest(STACK).id)}


if __name__ == "__main__":
    main()
