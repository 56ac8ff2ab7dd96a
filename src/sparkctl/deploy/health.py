"""Health in phases, each with its own budget from the stack: starting -> loading -> ready ->
canary.

Connection refused is normal while vLLM loads (its port opens only once the weights are in);
the last engine log line is shown as progress meanwhile. A container that exits fails at once
with its last 30 log lines and a hint for known signatures. Called by the pipeline.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from sparkctl.adapters import engine as engine_http
from sparkctl.bench.metrics import between, parse
from sparkctl.container import Inspected
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase
from sparkctl.spec.models import Stack

HINTS = (
    (re.compile(r"has no attribute '_draft_(kv_cache_group_ids|layer_to_kv_cache_gid)'"),
     "the DFlash 2-line shim is missing from vllm/v1/spec_decode/dflash.py: add patch set dspark-dflash "
     "to the stack (`sparkctl patch check STACK` shows what it changes)"),
    (re.compile(r"vllm_patches are not applied|cannot import name 'DSpark", re.I),
     "the draft's vllm_patches overlays are not mounted: the stack needs patch set dspark-dflash"),
    (re.compile(r"/dev/shm|shm_open|Bus error", re.I),
     "shared memory is too small: raise container.shm_size or use container.ipc: host"),
    (re.compile(r"No available memory for the cache blocks|out of memory|OOM|Cannot allocate memory", re.I),
     "out of memory: lower resources.gpu_memory_utilization or stop other stacks (`sparkctl status`)"),
    (re.compile(r"address already in use", re.I),
     "the port is in use: another process listens on it (`ss -ltnp`); change vllm.port in the stack"),
)


POLL = 0.01  # seconds between looks at the engine's port
LOOK = 0.25  # seconds between looks at its container (state, last log line)
HEADLESS_SETTLE = 1.0  # s a headless rank's container must keep running to count as started


class HealthError(SparkctlError):
    """The engine did not become healthy; carries the phase and the engine's last words."""

    def __init__(self, message: str, *, phase: Phase, logs: str = "") -> None:
        hint = next((h for pattern, h in HINTS if pattern.search(logs)), None)
        tail = "\n".join(logs.strip().splitlines()[-30:])
        full = message + (f"\nhint: {hint}" if hint else "") + (f"\nlast engine log lines:\n{tail}" if tail else "")
        super().__init__(full)
        self.phase, self.hint = phase, hint


@dataclass
class Engine:
    """What health checks need from the container: its state and its log."""

    inspect: Callable[[], Inspected]
    logs: Callable[[int], str]


def wait_healthy(stack: Stack, url: str, engine: Engine, *, reporter: Reporter) -> float | None:
    """Walk the phases; returns the canary's speculative acceptance (None when not speculative).
    The port is polled every `POLL` (a refused connection on loopback costs microseconds), so
    the engine's first 200 is seen within ~10 ms; Docker is asked only every `LOOK`."""
    budgets = stack.health
    deadline = time.monotonic() + budgets.start
    reporter.phase(stack.name, Phase.STARTING)
    while _alive(engine, Phase.STARTING) != "running":
        _within(deadline, Phase.STARTING, budgets.start, engine)
        time.sleep(POLL)
    reporter.phase(stack.name, Phase.LOADING)
    deadline, shown, look = time.monotonic() + budgets.load, "", 0.0
    while http_status(url + "/health") is None:
        if time.monotonic() >= look:  # the container's state and last log line: Docker calls, a few times a second
            _alive(engine, Phase.LOADING)
            _within(deadline, Phase.LOADING, budgets.load, engine)
            line = (engine.logs(1).strip().splitlines() or [""])[-1]
            if line and line != shown:
                reporter.phase(stack.name, Phase.LOADING, line[-160:])
                shown = line
            look = time.monotonic() + LOOK
        time.sleep(POLL)
    reporter.phase(stack.name, Phase.READY)
    deadline = time.monotonic() + budgets.ready
    while not _ready(url, stack.served_name):
        _alive(engine, Phase.READY)
        _within(deadline, Phase.READY, budgets.ready, engine)
        time.sleep(POLL)
    reporter.phase(stack.name, Phase.CANARY)
    return _canary(stack, url, engine)


def metrics(url: str) -> dict[str, float]:
    """The engine's /metrics, parsed (`bench.metrics.parse`: labels folded)."""
    return parse(engine_http.text(url, "/metrics", timeout=10))


def _canary(stack: Stack, url: str, engine: Engine) -> float | None:
    speculative = stack.vllm is not None and stack.vllm.speculative is not None
    before = metrics(url) if speculative else {}
    body = {"model": stack.served_name, "messages": [{"role": "user", "content": stack.canary.prompt}],
            "max_tokens": stack.canary.max_tokens, "min_tokens": min(8, stack.canary.max_tokens)}
    try:
        status, answer = engine_http.call(url, "/v1/chat/completions", body=body, timeout=stack.health.canary)
        if status != 200:
            raise ValueError(f"HTTP {status}: {answer[:300].decode(errors='replace')}")
        reply = json.loads(answer)
    except (OSError, ValueError) as e:
        raise HealthError(f"canary chat completion failed: {e}", phase=Phase.CANARY, logs=engine.logs(30)) from None
    text = (reply.get("choices") or [{}])[0].get("message", {}).get("content") or ""
    if not text.strip():
        raise HealthError("canary chat completion returned no text", phase=Phase.CANARY, logs=engine.logs(30))
    if not speculative:
        return None
    rate = between(before, metrics(url)).acceptance
    floor = stack.expectations.min_acceptance
    if floor is not None and (rate is None or rate < floor):
        shown = "no drafts" if rate is None else f"{rate:.2f}"
        raise HealthError(f"canary speculative acceptance {shown} is under the stack's floor {floor:.2f}",
                          phase=Phase.CANARY)
    return rate


def wait_started(engine: Engine) -> None:
    """A headless rank serves no HTTP: it is started once its container still runs after
    `HEADLESS_SETTLE` seconds (the group's rank 0 proves the rest when it serves and answers)."""
    deadline = time.monotonic() + HEADLESS_SETTLE
    while time.monotonic() < deadline:
        _alive(engine, Phase.STARTING)
        time.sleep(LOOK)
    _alive(engine, Phase.STARTING)


def _alive(engine: Engine, phase: Phase) -> str:
    found = engine.inspect()
    if found.status in ("exited", "dead"):
        cause = "was OOM-killed" if found.oom_killed else f"exited with code {found.exit_code}"
        raise HealthError(f"engine container {cause} while {phase}", phase=phase, logs=engine.logs(30)
                          + ("\nOOMKilled" if found.oom_killed else ""))
    return found.status


def _within(deadline: float, phase: Phase, budget: float, engine: Engine) -> None:
    if time.monotonic() > deadline:
        key = {Phase.STARTING: "start", Phase.LOADING: "load", Phase.READY: "ready"}.get(phase, "canary")
        raise HealthError(f"engine still {phase} after its {budget:g} s budget (health.{key} "
                          "in the stack); it may hang", phase=phase, logs=engine.logs(30))


def http_status(url: str) -> int | None:
    """The status of GET url, or None while nothing accepts the connection."""
    return engine_http.status(url)


def _ready(url: str, served_name: str) -> bool:
    if engine_http.status(url, "/health") != 200:
        return False
    try:
        return any(m.get("id") == served_name for m in engine_http.models(url, timeout=5))
    except (OSError, ValueError):
        return False
