"""The environment a benchmark ran in, captured as the run starts and stored beside its figures
as `environment.json`: the date, the host (kernel, OS, GPU, driver, CUDA, memory), the engine (the
vLLM version the running engine reports, its image, the command line it serves with, its served
name), llama-benchy's version, the sampling temperature, the prompt corpus, the engine's KV-cache
capacity and the profile. The report prints it with the figures, since a figure means little
without the machine and software that produced it. Anything missing (no nvidia-smi, an engine
that does not answer) is "unknown" or null, never an exception. Every read goes through a `Probe`,
so tests hand in fake command outputs. Called by the benchmark runner.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from sparkctl.adapters import engine
from sparkctl.bench import metrics
from sparkctl.bench.corpus import Choice
from sparkctl.bench.profiles import Profile

UNKNOWN = "unknown"
FILE = "environment.json"
GPU_QUERY = ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"]
CUDA = re.compile(r"CUDA Version:\s*([\d.]+)")


@dataclass(frozen=True)
class Engine:
    """What the caller knows about the engine a run measures."""

    served_model_name: str
    url: str | None = None  # the engine's own base URL (it answers GET /version), not the gateway's
    metrics_url: str | None = None
    image: str | None = None  # ref, with @digest when the deployment pinned one
    flags: str | None = None  # the command line the engine serves with


def run_command(argv: list[str]) -> str | None:
    """A command's stdout, or None when it is missing, fails or hangs."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def http_get(url: str) -> str | None:
    """The body of GET `url` (the engine, on loopback: no proxy), or None when it does not answer."""
    try:
        return engine.text(url, timeout=10)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Probe:
    """Where the facts come from: commands, files and the engine's HTTP API."""

    command: Callable[[list[str]], str | None] = run_command
    read: Callable[[Path], str | None] = read_text
    fetch: Callable[[str], str | None] = http_get
    now: Callable[[], datetime] = lambda: datetime.now(UTC)


def capture(engine: Engine, *, profile: Profile, corpus: Choice, coherence: bool,
            probe: Probe | None = None) -> dict[str, Any]:
    """The environment of a run of `profile` against `engine`, as `environment.json` holds it."""
    probe = probe or Probe()
    return {
        "date": probe.now().astimezone(UTC).isoformat(timespec="seconds"),
        "host": host(probe),
        "engine": engine_facts(engine, probe),
        "llama_benchy": llama_benchy_version(),
        "temperature": profile.temperature,
        "corpus": corpus.record(),
        "coherence": "checked" if coherence else "skipped",
        "kv_cache_tokens": kv_cache_tokens(engine, probe),
        "profile": {"name": profile.name, "args": profile.args()},
    }


def write(folder: Path, environment: dict[str, Any]) -> Path:
    path = folder / FILE
    path.write_text(json.dumps(environment, indent=2) + "\n")
    return path


def host(probe: Probe) -> dict[str, Any]:
    gpu, driver, compute = _gpu(probe.command(GPU_QUERY))
    banner = probe.command(["nvidia-smi"]) or ""
    cuda = CUDA.search(banner)
    uname = platform.uname()
    return {"hostname": uname.node or UNKNOWN, "kernel": uname.release or UNKNOWN,
            "os": _os_name(probe.read(Path("/etc/os-release"))), "arch": uname.machine or UNKNOWN,
            "gpu": gpu, "compute_capability": compute, "driver": driver, "cuda": cuda[1] if cuda else UNKNOWN,
            "memory_gib": _memory_gib(probe.read(Path("/proc/meminfo")))}


def engine_facts(engine: Engine, probe: Probe) -> dict[str, Any]:
    return {"vllm_version": vllm_version(engine, probe), "image": engine.image or UNKNOWN,
            "flags": engine.flags or UNKNOWN, "served_model_name": engine.served_model_name}


def vllm_version(engine: Engine, probe: Probe) -> str:
    """What the running engine says at GET /version (vLLM's OpenAI server serves it)."""
    body = probe.fetch(engine.url.rstrip("/") + "/version") if engine.url else None
    try:
        version = json.loads(body)["version"] if body else None
    except (ValueError, KeyError, TypeError):
        version = None
    return str(version) if version else UNKNOWN


def kv_cache_tokens(engine: Engine, probe: Probe) -> int | None:
    text = probe.fetch(engine.metrics_url) if engine.metrics_url else None
    return metrics.kv_tokens(text) if text else None


def llama_benchy_version() -> str:
    try:
        return metadata.version("llama-benchy")
    except metadata.PackageNotFoundError:
        return UNKNOWN


def _gpu(query: str | None) -> tuple[str, str, str]:
    """Name, driver and compute capability of the first GPU from nvidia-smi's CSV (`NVIDIA GB10,
    580.95.05, 12.1`; an older nvidia-smi without `compute_cap` leaves it unknown)."""
    first = (query or "").strip().splitlines()[:1]
    parts = [p.strip() for p in first[0].split(",")] if first else []
    if len(parts) < 2 or not parts[0]:
        return UNKNOWN, UNKNOWN, UNKNOWN
    return parts[0], parts[1] or UNKNOWN, (parts[2] if len(parts) > 2 and parts[2] else UNKNOWN)


def _os_name(text: str | None) -> str:
    for line in (text or "").splitlines():
        key, _, value = line.partition("=")
        if key == "PRETTY_NAME":
            return value.strip().strip('"') or UNKNOWN
    return UNKNOWN


def _memory_gib(text: str | None) -> float | None:
    found = re.search(r"^MemTotal:\s+(\d+) kB", text or "", re.MULTILINE)
    return round(int(found[1]) / 1024**2, 1) if found else None
