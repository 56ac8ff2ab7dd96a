"""The machine's memory as admission and the switch planner see it: what each stack holds now
(awake: its fraction; parked: its share from `policy/parking.py`; stopped: nothing), and each
stack's footprint, with its weights' size read from their files. Fractions are of the machine's
memory (MemTotal, or SPARKCTL_MEMORY_TOTAL_GIB).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.adapters.hub import repo_folder
from sparkctl.policy.parking import Footprint
from sparkctl.policy.switch import Memory

if TYPE_CHECKING:  # the Docker SDK loads with the commands that talk to Docker, not with `fleet`'s
    from sparkctl.adapters.docker import DockerEngine
from sparkctl.settings import Settings
from sparkctl.spec.engine import Weights
from sparkctl.spec.load import Catalog
from sparkctl.state.store import Store

GIB = 1 << 30
PAGE = 4096


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
        gib = self.settings.memory_total_gib
        return int(gib * GIB) if gib else meminfo("MemTotal")

    def footprint(self, name: str, awake: float | None = None) -> Footprint:
        """The stack's fraction, its weights' share (0 until they are on disk) and the residue."""
        residue = self.settings.park_residue_gib * GIB / self.total
        if name not in self.catalog.stacks:  # its file is gone: the container's label is what is left
            return Footprint(awake or 0.0, 0.0, residue)
        stack = self.catalog.stack(name)
        weights = sum(folder_bytes(d) for d in filter(None, map(self._weights_dir, (stack.model, stack.draft))))
        return Footprint(stack.resources.gpu_memory_utilization, weights / self.total, residue)

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
