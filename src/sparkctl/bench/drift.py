"""Greedy drift (issue 49): sparkctl's fixed prompts (`drift_prompts.json`) asked at temperature 0,
with a fixed `max_tokens` and `seed`, through the gateway as a client would (the `openai` client,
the stack's served name, the gateway's API key); the outputs are stored with the deployment's
fingerprint and parts (`state/drift.py`) and compared:

- with the stack's last passing run on the same weights (model repo and commit) whose image
  digest, patch set or draft differ: a new build of the same model;
- on a speculative stack, with its no-spec twin's: the newest passing run of another stack,
  without speculation, on the same model repo and commit. Speculative verification is lossless at
  temperature 0 against the same target, so a drift from the twin is a finding.

A comparison counts the identical outputs and, for the first that differs, names the prompt, the
character (and, where the engine returned token ids, the token) where it diverged, with an excerpt
of both. Reported always; refused only where the stack's `expectations.drift.gate` asks. The
switch and `bench run` call `record_and_compare` after a passing gate; the report's "Greedy
drift" section (`report/drift.py`) reads `review`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from sparkctl.bench.gate import GateFailed, Verdict
from sparkctl.bench.quality import Endpoint, gateway
from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase
from sparkctl.settings import Settings
from sparkctl.spec.models import Drift as DriftSpec
from sparkctl.spec.models import Stack
from sparkctl.state.drift import GreedyRun, Output
from sparkctl.state.store import Store

PROMPTS = Path(__file__).with_name("drift_prompts.json")
MAX_TOKENS = 128  # long enough to drift somewhere, short enough for a switch to wait on
SEED = 0
CONCURRENCY = 4  # prompts asked at once: modest, a gate's side errand
EXCERPT = 24  # characters shown on each side of a divergence
BUILD = ("image", "patches", "draft")  # the parts of a new build of the same weights


@dataclass(frozen=True)
class Prompts:
    texts: tuple[str, ...]
    max_tokens: int = MAX_TOKENS
    seed: int = SEED

    @property
    def key(self) -> str:
        """What was asked, as a key: outputs are compared only between runs of the same key."""
        asked = json.dumps({"texts": self.texts, "max_tokens": self.max_tokens, "seed": self.seed, "temperature": 0})
        return "sha256:" + hashlib.sha256(asked.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Divergence:
    index: int  # the prompt's, from 0
    char: int  # the first character that differs
    token: int | None  # the first token that differs, where both sides have token ids
    ours: str  # an excerpt of each side around it
    theirs: str


@dataclass(frozen=True)
class Comparison:
    identical: int
    total: int
    first: Divergence | None  # None: all identical

    @property
    def share(self) -> float:
        return self.identical / self.total if self.total else 1.0

    def describe(self) -> str:
        said = f"{self.identical} of {self.total} identical"
        d = self.first
        if d is None:
            return said
        at = f"character {d.char}" + (f", token {d.token}" if d.token is not None else "")
        return f"{said}; prompt {d.index} first diverged at {at}: {d.ours!r} here, {d.theirs!r} there"


@dataclass(frozen=True)
class Drift:
    """What `review` found for one greedy run, and the drift gate's verdict on it."""

    run: int
    build: tuple[GreedyRun, Comparison] | None  # against the last passing build of the same weights
    twin: tuple[GreedyRun, Comparison] | None  # against the no-spec twin (speculative stacks only)
    lines: tuple[str, ...]  # the report's lines
    verdict: Verdict  # passed unless the stack's drift gate refuses it (`judged`)


class DriftFailed(GateFailed):
    def __init__(self, drift: Drift) -> None:
        SparkctlError.__init__(self, f"greedy drift gate: {drift.verdict.describe()}")
        self.verdict, self.drift = drift.verdict, drift


def shipped() -> Prompts:
    """sparkctl's own prompt set."""
    return Prompts(tuple(json.loads(PROMPTS.read_text())))


def record_and_compare(stack: Stack, *, settings: Settings, store: Store, prompts: Prompts | None = None) -> Drift:
    """Ask the running `stack` the prompts through the gateway, store the outputs with its
    deployment, compare them and judge them by `expectations.drift`; raises `DriftFailed` only
    when the stack's drift gate refuses them (the run is then stored as failed)."""
    deployment = store.deployments.latest(stack.name)
    if deployment is None or deployment.phase is not Phase.RUNNING:
        raise SparkctlError(f"{stack.name} is not running: `sparkctl up {stack.name}` first")
    prompts = prompts or shipped()
    outputs = ask(gateway(stack, settings), prompts)
    speculative = stack.vllm is not None and stack.vllm.speculative is not None
    model = stack.model.repo if stack.model is not None and stack.model.repo else ""
    run_id = store.greedy.record(stack.name, deployment.fingerprint, deployment.parts, model=model,
                                 speculative=speculative, prompts=prompts.key, outputs=outputs)
    run = store.greedy.run(run_id)
    assert run is not None
    drift = judged(review(run, store.greedy.passed(prompts=run.prompts, model=run.model)), stack.expectations.drift)
    store.greedy.judge(run_id, drift.verdict.describe())
    if not drift.verdict.passed:
        raise DriftFailed(drift)
    return drift


def ask(endpoint: Endpoint, prompts: Prompts, *, concurrency: int = CONCURRENCY, timeout: float = 600) -> list[Output]:
    """Each prompt's reply at temperature 0, in the prompts' order, with its token ids where the
    engine returns them (vLLM's `return_token_ids`)."""
    import openai

    def one(text: str) -> Output:
        reply = client.chat.completions.create(
            model=endpoint.model, messages=[{"role": "user", "content": text}], temperature=0,
            max_tokens=prompts.max_tokens, seed=prompts.seed, extra_body={"return_token_ids": True})
        choice = reply.choices[0]
        ids = (choice.model_extra or {}).get("token_ids")
        return Output(choice.message.content or "", tuple(ids) if isinstance(ids, list) else None)

    try:
        with openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key or "unused", max_retries=0,
                           timeout=timeout) as client, ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(one, prompts.texts))
    except openai.APIError as e:
        raise SparkctlError(f"greedy drift: the gateway refused a prompt for {endpoint.model} at "
                            f"{endpoint.base_url}: {str(e)[:300]}") from None


def review(run: GreedyRun, passed: Sequence[GreedyRun]) -> Drift:
    """`run` against its last passing build and, if it speculates, its no-spec twin, both found
    among `passed` (the passing runs on its prompts and model repo, newest first). Pure."""
    lines = []
    build = baseline(run, passed)
    against = (build, compare(run.outputs, build.outputs)) if build is not None else None
    if against is not None:
        lines.append(f"greedy outputs against {run.stack}'s run {build.id} ({_changed(build.parts, run.parts)}): "
                     f"{against[1].describe()}")
    else:
        lines.append(f"greedy outputs of {len(run.outputs)} prompts stored (run {run.id}): no earlier passing build "
                     f"of {run.stack} on the same weights to compare with")
    other = twin(run, passed)
    paired = (other, compare(run.outputs, other.outputs)) if other is not None else None
    if paired is not None:
        found = paired[1]
        lines.append(f"identical to its no-spec twin {other.stack} (run {other.id}): {found.describe()}"
                     if found.first is None else
                     f"drifted from its no-spec twin {other.stack} (run {other.id}): {found.describe()}; speculative "
                     "verification is lossless at temperature 0 against the same target, so this is a finding")
    elif run.speculative:
        lines.append(f"no no-spec twin on {run.model or 'its model'} at commit {run.parts.get('model') or '?'} has "
                     "greedy outputs to compare with")
    return Drift(run.id, against, paired, tuple(lines), Verdict(run.id))


def judged(drift: Drift, expect: DriftSpec) -> Drift:
    """`drift` with the gate's verdict: refused, where the stack asks (`gate: true`), when fewer than
    `min_identical` of the outputs are identical to the last passing build's or the twin's. Pure."""
    if not expect.gate:
        return drift
    asked = [(f"the last passing build (run {drift.build[0].id})", drift.build[1])] if drift.build else []
    if drift.twin:
        asked.append((f"the no-spec twin {drift.twin[0].stack} (run {drift.twin[0].id})", drift.twin[1]))
    reasons = tuple(f"{c.identical} of {c.total} greedy outputs identical to {what}, under the "
                    f"{expect.min_identical:.0%} asked (expectations.drift.min_identical)"
                    for what, c in asked if c.share < expect.min_identical)
    return replace(drift, verdict=Verdict(drift.run, reasons))


def compare(ours: Sequence[Output], theirs: Sequence[Output]) -> Comparison:
    """How many of the outputs are identical, and where the first that is not diverged. Pure."""
    same = [_identical(a, b) for a, b in zip(ours, theirs, strict=True)]
    index = next((i for i, s in enumerate(same) if not s), None)
    return Comparison(sum(same), len(same), None if index is None else divergence(index, ours[index], theirs[index]))


def divergence(index: int, ours: Output, theirs: Output) -> Divergence:
    char = _common(ours.text, theirs.text)
    token = _common(ours.tokens, theirs.tokens) if ours.tokens is not None and theirs.tokens is not None else None
    start = max(0, char - EXCERPT)
    return Divergence(index, char, token, _excerpt(ours.text, start, char), _excerpt(theirs.text, start, char))


def baseline(run: GreedyRun, passed: Sequence[GreedyRun]) -> GreedyRun | None:
    """The stack's newest passing run before `run` on the same weights (model commit) whose image
    digest, patch set or draft differ: the build `run`'s is new against."""
    return next((p for p in passed if p.id < run.id and p.stack == run.stack and _same_weights(p, run)
                 and _build(p.parts) != _build(run.parts)), None)


def twin(run: GreedyRun, passed: Sequence[GreedyRun]) -> GreedyRun | None:
    """For a speculative run: the newest passing run before it of another stack, without
    speculation, on the same model repo and commit."""
    if not run.speculative:
        return None
    return next((p for p in passed if p.id < run.id and p.stack != run.stack and not p.speculative
                 and _same_weights(p, run)), None)


def _identical(a: Output, b: Output) -> bool:
    """The same text, and the same tokens where both sides have their ids."""
    return a.text == b.text and (a.tokens is None or b.tokens is None or a.tokens == b.tokens)


def _same_weights(a: GreedyRun, b: GreedyRun) -> bool:
    return a.model == b.model and a.parts.get("model") == b.parts.get("model")


def _build(parts: dict[str, str]) -> tuple[str, ...]:
    return tuple(parts.get(k) or "" for k in BUILD)


def _changed(before: dict[str, str], after: dict[str, str]) -> str:
    names = {"image": "image", "patches": "patch set", "draft": "draft"}
    return ", ".join(f"{names[k]} {_short(before.get(k))} -> {_short(after.get(k))}" for k in BUILD
                     if (before.get(k) or "") != (after.get(k) or ""))


def _short(value: str | None) -> str:
    if not value:
        return "none"
    return value.removeprefix("sha256:")[:12]


def _common(a: Sequence, b: Sequence) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _excerpt(text: str, start: int, at: int) -> str:
    return ("…" if start else "") + text[start:at + EXCERPT] + ("…" if at + EXCERPT < len(text) else "")
