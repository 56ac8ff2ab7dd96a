"""The machine's memory as admission and the switch planner see it: what each stack holds now
(awake: its fraction; parked: its share from `policy/parking.py`; stopped: nothing), and each
stack's footprint, with its weights' size read from their files, and the KV cache its engine is
given. Fractions are of the usable memory (`usable_memory`).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.adapters import cuda
from sparkctl.adapters.hub import repo_folder
from sparkctl.errors import SparkctlError
from sparkctl.policy.parking import Footprint, kv_budget
from sparkctl.policy.switch import Memory

if TYPE_CHECKING:  # the Docker SDK loads with the commands that talk to Docker, not with `fleet`'s
    from sparkctl.adapters.docker import DockerEngine
from sparkctl.settings import Settings
from sparkctl.spec.engine import Weights
from sparkctl.spec.load import Catalog
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store

GIB = 1 << 30
PAGE = 4096
USABLE = "usable-memory.json"  # in the state dir: CUDA's free memory, measured with none of our engines running
SIZES = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def usable_memory(settings: Settings, *, engines_running: bool) -> int:
    """The memory engines' fractions are of, in bytes (`usable`)."""
    return usable(settings, engines_running=engines_running)[0]


def usable(settings: Settings, *, engines_running: bool) -> tuple[int, str]:
    """The memory engines' fractions are of, and where the figure comes from: SPARKCTL_MEMORY_TOTAL_GIB,
    else what CUDA reports free while none of this instance's engines run (measured now, or kept in
    the state dir from the last time), else MemTotal (no CUDA: a machine without an NVIDIA driver)."""
    if settings.memory_total_gib:
        return int(settings.memory_total_gib * GIB), "SPARKCTL_MEMORY_TOTAL_GIB"
    kept = settings.state_dir / USABLE
    free = None if engines_running else cuda.free_memory(settings.cuda_library)
    if free:
        measured = min(free, meminfo("MemTotal"))
        kept.parent.mkdir(parents=True, exist_ok=True)
        tmp = kept.with_suffix(".tmp")
        tmp.write_text(json.dumps({"bytes": measured, "source": "cuMemGetInfo"}))
        os.replace(tmp, kept)
        return measured, "CUDA's free memory, measured now"
    try:
        return int(json.loads(kept.read_text())["bytes"]), "CUDA's free memory, as the daemon measured it"
    except (OSError, ValueError, KeyError, TypeError):
        return meminfo("MemTotal"), "MemTotal: not measured yet (no CUDA, or no daemon has planned)"


def kv_plan(stack: Stack, settings: Settings, *, weights: int, usable: int) -> int | None:
    """The KV cache `stack`'s engine is given, in bytes (vLLM's --kv-cache-memory-bytes); None
    where vLLM sizes it (`resources.kv_cache: engine`). `weights`: its target's and draft's bytes
    (a multi-node rank holds its share)."""
    if stack.resources.kv_cache == "engine":
        return None
    fraction, overhead = stack.resources.gpu_memory_utilization, settings.engine_overhead_gib
    weights //= stack.parallel.tensor * stack.parallel.pipeline if stack.parallel else 1
    kv = kv_budget(fraction, usable=usable, weights=weights, overhead=int(overhead * GIB))
    if kv <= 0:
        raise SparkctlError(
            f"{stack.name} leaves its engine no KV cache: {fraction:g} of {usable / GIB:.1f} GiB usable is "
            f"{fraction * usable / GIB:.1f} GiB, and its weights take {weights / GIB:.1f} GiB plus {overhead:g} GiB "
            "of engine overhead (SPARKCTL_ENGINE_OVERHEAD_GIB); raise resources.gpu_memory_utilization, or set "
            "SPARKCTL_MEMORY_TOTAL_GIB if the usable memory is wrong")
    return kv


def size_bytes(size: str) -> int:
    """A stack's size notation (`16g`, `1.5g`, `1024`: spec.base.SIZE) in bytes."""
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([bkmg]?)", size.lower()).groups()  # type: ignore[union-attr]
    return int(float(number) * SIZES[unit])


def meminfo(key: str, path: Path = Path("/proc/meminfo")) -> int:
    """One /proc/meminfo figure in bytes (MemTotal, MemAvailable, ...)."""
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0]) * 1024
    raise KeyError(f"{key} is not in {path}")


def available() -> int:
    """MemAvailable plus the free pages on the kernel's per-CPU lists, which it leaves out: since
    Linux 6.7 those lists hold hundreds of MB right after a large free and drain over seconds, so
    MemAvailable alone lags a free (and misses the next allocation that reuses those pages)."""
    per_cpu = sum(int(n) for n in re.findall(r"\n\s+count:\s+(\d+)", Path("/proc/zoneinfo").read_text()))
    return meminfo("MemAvailable") + per_cpu * PAGE


def folder_bytes(path: Path) -> int:
    """The size of every file under `path`, following the HF cache's snapshot links to their blobs."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@dataclass
class MemoryView:
    settings: Settings
    store: Store
    catalog: Catalog
    docker: DockerEngine

    @functools.cached_property
    def total(self) -> int:
        return usable_memory(self.settings, engines_running=any(c.running for c in self.docker.containers()))

    def footprint(self, name: str, awake: float | None = None) -> Footprint:
        """The stack's fraction (with its own /dev/shm, which is carved from the same pool), its
        weights' share (0 until they are on disk) and the residue."""
        residue = self.settings.park_residue_gib * GIB / self.total
        if name not in self.catalog.stacks:  # its file is gone: the container's label is what is left
            return Footprint(awake or 0.0, 0.0, residue)
        stack = self.catalog.stack(name)
        return Footprint(stack.resources.gpu_memory_utilization + self.shm(stack) / self.total,
                         self.weights(stack) / self.total, residue)

    def weights(self, stack: Stack) -> int:
        """The bytes of the stack's weights (target and draft) on disk; 0 until they are fetched."""
        return sum(folder_bytes(d) for d in filter(None, map(self._weights_dir, (stack.model, stack.draft))))

    def shm(self, stack: Stack) -> int:
        """The /dev/shm of the stack's own: Docker ignores shm_size with `ipc: host`, where the
        engine shares the host's (whose use MemAvailable already counts)."""
        c = stack.container
        return size_bytes(c.shm_size) if c.shm_size and c.ipc != "host" else 0

    def kv_bytes(self, stack: Stack) -> int | None:
        """The KV cache the stack's engine is given (None: vLLM sizes it)."""
        return kv_plan(stack, self.settings, weights=self.weights(stack), usable=self.total)

    def held(self, parked: Mapping[str, int]) -> dict[str, float]:
        """What each stack with a running container holds now."""
        return {c.stack: self.footprint(c.stack, c.memory).held(parked[c.stack]) if parked.get(c.stack)
                else c.memory or 0.0 for c in self.docker.containers() if c.running}

    def now(self, parked: Mapping[str, int]) -> Memory:
        return Memory(self.held(parked), self.settings.memory_ceiling,
                      {s: level for s, level in parked.items() if level})

    def _weights_dir(self, weights: Weights | None) -> Path | None:
        if weights is None:
            return None
        if weights.path is not None:
            return Path(weights.path)
        commit = self.store.digests.get(f"hf:{weights.repo}@{weights.revision}")
        folder = repo_folder(self.settings.hf_cache_dir, str(weights.repo)) / "snapshots" / str(commit)
        return folder if commit and folder.is_dir() else None
