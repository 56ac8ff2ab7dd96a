"""Instances: several sparkctl installations on one Docker engine, kept apart.

An instance is named by `SPARKCTL_INSTANCE` (or derived from the state dir). Everything it
creates carries the label `sparkctl.instance` and the name in container and compose project
names; the Docker adapter lists only its own instance's containers, so the daemon, status,
down, the switch and every cleanup touch nothing else. Imported by settings, spec rendering
and the adapters; pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

DEFAULT = "default"
PATTERN = r"^[a-z0-9][a-z0-9-]{0,30}$"
LABEL = "sparkctl.instance"


def owned(labels: Mapping[str, str], instance: str) -> bool:
    """Whether a sparkctl container with these labels belongs to `instance`. Containers made
    before instances existed carry no instance label: the default instance adopts them."""
    return labels.get(LABEL, DEFAULT) == instance


def container_name(stack: str, instance: str) -> str:
    """`sparkctl-<stack>` for the default instance (the names it always had), else
    `sparkctl-<instance>_<stack>`: neither name may hold `_`, so two never collide."""
    return f"sparkctl-{stack}" if instance == DEFAULT else f"sparkctl-{instance}_{stack}"


def derived(state_dir: Path, default_state_dir: Path) -> str:
    """The instance a state dir stands for when none is named: `default` for the default dir,
    else its folder name plus a short hash of its path (two dirs never share a name)."""
    path = state_dir.expanduser().absolute()
    if path == default_state_dir.expanduser().absolute():
        return DEFAULT
    slug = re.sub(r"[^a-z0-9]+", "-", path.name.lower()).strip("-")[:20] or "state"
    import hashlib  # ~6 ms: only for an instance named after its state dir

    return f"{slug}-{hashlib.sha256(str(path).encode()).hexdigest()[:6]}"
