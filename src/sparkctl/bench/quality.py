"""The quality gate's measurement: lm-evaluation-harness (`lm_eval`, the `quality` extra, pinned)
asks a task's questions through the gateway's OpenAI endpoint, as a client would, by the stack's
served name and with the gateway's API key; the accuracy, its standard error, the items scored
and the tool's version come back. lm-eval runs as a child process (`lmeval.py`), its key in its
environment, never on its command line; sparkctl's own task (`sparkctl_arith`) runs with the
Hugging Face libraries offline. `assess` runs it against a running stack, stores the run with the
deployment's fingerprint and parts (`state/quality.py`), and judges it against the stack's
`expectations.quality` and its last passing run (`gate.judge_quality`): for the switch's gate
(`switchover.py`), a retest's trial (at its engine), and `sparkctl bench run -p quality`
(`on_demand`). The run's folder keeps lm-eval's results, every item's prompt, reply and score,
its command line and its log.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl.bench.gate import Verdict, judge_quality
from sparkctl.bench.lmeval import TASKS, UNKNOWN
from sparkctl.bench.profiles import QUALITY
from sparkctl.errors import SparkctlError
from sparkctl.messages import BenchDone, BenchRequest
from sparkctl.phase import Phase
from sparkctl.settings import Settings
from sparkctl.spec.models import Quality, Stack
from sparkctl.state.quality import Measured, QualityRun
from sparkctl.state.store import Store

CONCURRENCY = 8  # questions asked at once: lm-eval's chat model sends one item a request
KEY_ENV = "OPENAI_API_KEY"  # what lm-eval's chat-completions model reads its key from
# What lm-eval must not take from sparkctl's own environment: another key, a Hub token.
_DROPPED = (KEY_ENV, "HF_TOKEN", "SPARKCTL_HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
_OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # an OpenAI base URL, ending in /v1
    model: str  # the name to ask for (an alias, a served name)
    api_key: str | None = field(default=None, repr=False)  # the gateway's, when it requires one


def gateway(stack: Stack, settings: Settings) -> Endpoint:
    """The gateway's OpenAI endpoint, asked for `stack` by its served name with the gateway's first API key."""
    keys = [k.get_secret_value() for k in settings.gateway_api_keys]
    return Endpoint(f"{settings.gateway_url}/v1", stack.served_name, api_key=keys[0] if keys else None)


def measure(endpoint: Endpoint, quality: Quality, *, folder: Path, datasets: Path | None = None,
            concurrency: int = CONCURRENCY, timeout: float = 3 * 3600) -> Measured:
    """Run lm-eval's `quality.task` over its first `quality.items` questions against `endpoint`.
    A task of the Hub's (GSM8K, MMLU, ...) fetches its dataset once into `datasets` (the HF cache's,
    kept like the weights) and reads it from there after."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "sparkctl.bench.lmeval", "--url", f"{endpoint.base_url}/chat/completions",
               "--model", endpoint.model, "--task", quality.task, "--items", str(quality.items),
               "--concurrency", str(concurrency), "--output", str(folder)]
    (folder / "command.txt").write_text(shlex.join(command) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED} | {KEY_ENV: endpoint.api_key or ""}
    if shipped(quality.task):
        # Nothing to fetch: the Hugging Face libraries stay offline, their caches in the run folder.
        env |= _OFFLINE | {"HF_HOME": str(folder / "hf"), "HF_DATASETS_CACHE": str(folder / "hf" / "datasets")}
    elif datasets is not None:
        env |= {"HF_DATASETS_CACHE": str(datasets)}
    log = folder / "lm-eval.log"
    with log.open("w") as out:
        try:
            code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            raise SparkctlError(f"lm-eval ran past {timeout:g} s on {quality.task}; see {log}") from None
    if code != 0 or not (folder / "results.json").is_file():
        raise SparkctlError(failure(code, log.read_text(errors="replace"), log=log))
    return measured(json.loads((folder / "results.json").read_text()), quality.task)


def assess(stack: Stack, *, settings: Settings, store: Store, via_gateway: bool = True,
           baseline_of: str | None = None) -> tuple[QualityRun, Verdict]:
    """Measure the running `stack` through the gateway (or at its engine: a retest's trial, which the
    gateway never routes), store the run with its deployment's fingerprint, judge it against
    `expectations.quality` and the last passing run of `baseline_of` (default: the stack itself),
    record the verdict."""
    quality = stack.expectations.quality
    if quality is None:
        raise SparkctlError(f"{stack.name} sets no `expectations.quality`: add `quality: {{task: sparkctl_arith, "
                            "items: 200, floor: 0.7}` (or `max_drop: 0.05`) under `expectations` in its stack file")
    deployment = store.deployments.latest(stack.name)
    if deployment is None or deployment.phase is not Phase.RUNNING:
        raise SparkctlError(f"{stack.name} is not running: `sparkctl up {stack.name}` first")
    endpoint = gateway(stack, settings) if via_gateway else Endpoint(f"{stack.url}/v1", stack.served_name)
    run_id = store.quality.begin(stack.name, deployment.fingerprint, deployment.parts, task=quality.task,
                                 items=quality.items)
    folder = settings.state_dir / "quality" / str(run_id)
    try:
        result = measure(endpoint, quality, folder=folder, datasets=settings.hf_cache_dir / "datasets")
    except SparkctlError as e:
        store.quality.finish(run_id, folder=str(folder), error=str(e))
        raise
    store.quality.finish(run_id, folder=str(folder), measured=result)
    run = store.quality.run(run_id)
    assert run is not None
    verdict = judge_quality(run, quality, baseline=store.quality.last_pass(baseline_of or stack.name, task=run.task,
                                                                     items=run.items))
    store.quality.judge(run_id, verdict.describe())
    judged = store.quality.run(run_id)
    assert judged is not None
    return judged, verdict


def on_demand(stack: Stack, ask: BenchRequest, *, settings: Settings, store: Store) -> BenchDone:
    """`sparkctl bench run STACK -p quality`: the stack measured and judged as its quality gate does
    in a switch, nothing pinned or blacklisted (a `bench run` only records)."""
    if ask.depths or ask.runs or ask.temperature is not None:
        raise SparkctlError("--depths, --runs and --temperature shape llama-benchy's runs; `-p quality` asks the "
                            "task's questions at temperature 0 (the task and items are `expectations.quality`'s): "
                            "leave them out")
    run, verdict = assess(stack, settings=settings, store=store)
    return BenchDone(stack.name, run.id, QUALITY, run.folder, verdict.passed, verdict.describe(), quality=run.summary())


def shipped(task: str) -> bool:
    """Whether `task` is one of sparkctl's own, which run with no network."""
    return (TASKS / f"{task}.yaml").is_file()


def measured(results: dict, task: str) -> Measured:
    """The accuracy in lm-eval's results: the task's exact match (its first filter's), its stderr,
    the items scored and lm-eval's version."""
    scores = results.get("results", {}).get(task, {})
    key = next((k for k in scores if k.startswith("exact_match,")), None)
    if key is None:
        raise SparkctlError(f"lm-eval's results hold no exact-match score for {task} (a generation task scored by "
                            f"exact match is what the gate reads); they have: {', '.join(scores) or 'nothing'}")
    stderr = scores.get(key.replace("exact_match,", "exact_match_stderr,"))
    items = (results.get("n-samples", {}).get(task) or {}).get("effective") or scores.get("sample_len") or 0
    return Measured(items=int(items), accuracy=float(scores[key]),
                    stderr=float(stderr) if isinstance(stderr, int | float) else None,
                    tool=f"lm-eval {results.get('lm_eval_version', '?')}")


def failure(code: int, output: str, *, log: Path) -> str:
    """What went wrong in an lm-eval run, from its output, and what to do about it."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if any("No module named 'lm_eval'" in line for line in lines):
        return ("lm-eval is not installed: the quality gate needs sparkctl's `quality` extra "
                "(pip install 'sparkctl[quality]')")
    unknown = next((line for line in lines if line.startswith(UNKNOWN)), None)
    if unknown:
        return unknown.removeprefix(UNKNOWN)
    refused = next((line for line in lines if "API request failed" in line), None)
    if refused:
        return f"the endpoint refused lm-eval's requests: {refused.strip()[:300]}; see {log}"
    return f"lm-eval exited with code {code}: " + " | ".join(lines[-5:]) + f"; see {log}"
