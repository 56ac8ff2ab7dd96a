"""`make demo`: sparkctl's main job, offline, on simulated engines, in a few minutes.

A loopback registry holds the engine images under their real names (the sim image), a local
Hub serves the model repos, and everything sparkctl writes goes to ./demo/. Steps: start the
daemon and gateway; `up qwen36-dflash` (digest from the registry, weights, overlays, shim);
benchmark it; an agent loop through the gateway; switch `primary` to Aeon Gemma-4 without
speculation (aeon-gemma4-v2-nospec: seed 003's 81 tok/s is its no-spec figure) under that loop;
show the blacklisted `latest` Gemma refused; switch to diffusiongemma (compose); write the
comparison report. Engines decode at the calibrated profiles' real speed; only loading is
shortened. Everything started here is stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the fake Hub and registry live in tests/fakes
from sparkctl.cli.client import DaemonClient
from tests.fakes import sandbox
from tests.fakes.hub import Hub, HubServer
from tests.fakes.registry import Registry
from tests.fakes.repos import seed_repos
from tests.fakes.tinymodel import cached_model

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "demo"
SPARKCTL = str(ROOT / ".venv" / "bin" / "sparkctl")
TOKEN = "hf_demo_token_not_secret"
# The demo's own instance on free ports: safe to run beside an owner's live stacks.
INSTANCE = sandbox.environment("demo")
LABEL = "measured on simulated engines (sparkctl's sim, calibrated to the seeds' figures), not on a DGX Spark"


def main() -> int:
    shutil.rmtree(OUT, ignore_errors=True)
    (OUT / "state").mkdir(parents=True)
    for name in ("stacks", "patches", "compose"):
        shutil.copytree(ROOT / name, OUT / name)
    _demo_stacks()
    started = time.monotonic()
    registry = Registry(OUT / "registry")
    daemon = None
    cache = Path(os.environ.get("SPARKCTL_BUILD_CACHE", "/var/cache/sparkctl-build")) / "models"
    try:
        step("publishing the engine images to a loopback registry (the sim image under the real names)")
        registry.publish_sim()
        with HubServer(Hub(seed_repos(cached_model(cache)), token=TOKEN)) as hub:
            env = _env(registry.host, hub.endpoint)
            step("1. starting the daemon and the gateway")
            daemon = subprocess.Popen([SPARKCTL, "daemon"], env=env, stdout=(OUT / "daemon.log").open("w"),
                                      stderr=subprocess.STDOUT)
            _wait_for_daemon(daemon)
            gateway = f"http://127.0.0.1:{env['SPARKCTL_GATEWAY_PORT']}/v1"
            step("2. sparkctl up qwen36-dflash")
            sparkctl(env, "up", "qwen36-dflash")
            sparkctl(env, "switch", "primary", "qwen36-dflash")
            step("3. benchmark it (quick profile at depths 0 and 4096)")
            sparkctl(env, "bench", "run", "qwen36-dflash", "--profile", "quick", "--depths", "0,4096")
            step(f"4. an agent loop through the gateway ({gateway}, model `primary`)")
            print(f"   {agent_loop(gateway, calls=8)} answered, 0 failed")
            step("5. sparkctl switch primary aeon-gemma4-v2-nospec, with the agent loop running")
            with Background(gateway) as loop:
                sparkctl(env, "switch", "primary", "aeon-gemma4-v2-nospec")
            print(f"   the agent loop meanwhile: {loop.ok} answered, {loop.failed} failed")
            step("6. aeon-gemma4 at `latest` is refused by the blacklist")
            sparkctl(env, "up", "aeon-gemma4-latest", check=False)
            step("7. sparkctl switch primary diffusiongemma (a compose project)")
            with Background(gateway) as loop:
                sparkctl(env, "switch", "primary", "diffusiongemma")
            print(f"   the agent loop meanwhile: {loop.ok} answered, {loop.failed} failed")
            step("8. the comparison report of the three stacks")
            sparkctl(env, "bench", "report", "qwen36-dflash", "aeon-gemma4-v2-nospec", "diffusiongemma", "--out",
                     str(OUT / "report"), "--label", LABEL)
            sparkctl(env, "status")
            for stack in ("diffusiongemma", "aeon-gemma4-v2-nospec", "qwen36-dflash"):
                sparkctl(env, "down", stack, quiet=True)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(30)
        sandbox.remove(INSTANCE["SPARKCTL_INSTANCE"])  # this demo's containers, nothing else
        registry.stop()
    step(f"done in {time.monotonic() - started:.0f} s; nothing left running")
    report = OUT / "report" / "comparison.md"
    print(f"   report: {report} (graphs/, results/ and dataset.csv/json beside it)")
    print("   " + next((line for line in report.read_text().splitlines() if line.startswith("**Headline:**")), ""))
    return 0


class Background:
    """An agent loop on a thread while a block runs (a switch); counts answers and failures."""

    def __init__(self, gateway: str) -> None:
        self.gateway, self.ok, self.failed = gateway, 0, 0
        self.stop = threading.Event()

    def __enter__(self) -> Background:
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                agent_loop(self.gateway, calls=1)
                self.ok += 1
            except openai.OpenAIError:
                self.failed += 1


def agent_loop(gateway: str, *, calls: int) -> int:
    client = openai.OpenAI(base_url=gateway, api_key="demo", max_retries=0, timeout=600)
    history = [{"role": "system", "content": "You are a coding agent on a DGX Spark."}]
    for i in range(calls):
        history.append({"role": "user", "content": f"Step {i}: read the next file and summarise it."})
        reply = client.chat.completions.create(model="primary", messages=history[-6:], max_tokens=24)
        history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    return calls


def sparkctl(env: dict[str, str], *args: str, check: bool = True, quiet: bool = False) -> None:
    print(f"   $ sparkctl {' '.join(args)}", flush=True)
    done = subprocess.run([SPARKCTL, *args], env=env, check=False,
                          stdout=subprocess.DEVNULL if quiet else None)
    if check and done.returncode != 0:
        raise SystemExit(f"demo: `sparkctl {' '.join(args)}` failed; the daemon log is {OUT / 'daemon.log'}")


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _demo_stacks() -> None:
    """The demo's copy of the stacks: a Gemma stack on the blacklisted `latest` tag, and the
    qwen switch-over benchmark off (step 3 benchmarks it explicitly)."""
    (OUT / "stacks" / "aeon-gemma4-latest.yaml").write_text(
        "name: aeon-gemma4-latest\nextends: aeon-gemma4-v2\nimage:\n  tag: latest\n  allow_latest: true\n")
    with (OUT / "stacks" / "qwen36-dflash.yaml").open("a") as f:
        f.write("switch:\n  bench: off\n")


def _env(registry: str, hub: str) -> dict[str, str]:
    return {**os.environ, "SPARKCTL_STATE_DIR": str(OUT / "state"), "SPARKCTL_HF_CACHE_DIR": str(OUT / "hf"),
            "SPARKCTL_STACKS_DIR": str(OUT / "stacks"), "SPARKCTL_PATCHES_DIR": str(OUT / "patches"),
            "SPARKCTL_COMPOSE_DIR": str(OUT / "compose"),
            "SPARKCTL_REGISTRY_MIRRORS": f"ghcr.io={registry},docker.io={registry}",
            "SPARKCTL_HF_ENDPOINT": hub, "SPARKCTL_HF_TOKEN": TOKEN, "SPARKCTL_GPUS": "none",
            "SPARKCTL_ENGINE_ENV": "SPARKCTL_SIM_LOAD_SCALE=0.01",
            # Offline: the loopback corpus without probing the internet; the sim's replies are
            # random words, so llama-benchy's coherence question cannot be answered.
            "SPARKCTL_BENCH_CORPUS": "loopback", "SPARKCTL_BENCH_SKIP_COHERENCE": "1", **INSTANCE}


def _wait_for_daemon(daemon: subprocess.Popen) -> None:
    client = DaemonClient(OUT / "state" / "sparkctl.sock")
    deadline = time.monotonic() + 30
    while not client.available():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"demo: the daemon did not start; see {OUT / 'daemon.log'}")
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
