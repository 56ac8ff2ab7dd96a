"""Instances: several sparkctl installations on one Docker engine, kept apart.

An instance is named by `SPARKCTL_INSTANCE` (or derived from the state dir). Everything it
creates carries the label `sparkctl.instance` and the name in container and compose project
names; the Docker adapter lists only its own instance's containers, so the daemon, status,
down, the switch and every cleanup touch nothing else. Where an instance's state lives: the
files of its state dir, the default dir of an instance (and of the owner's config), and how an
instance and its state dir name each other (`Settings` resolves the pair with `resolve`).
Imported by settings, spec rendering, the adapters and the CLI's client; pure, stdlib only.
"""

from __future__ import annotations

import os
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


LOCK_FILE = "daemon.lock"  # a daemon holds an exclusive lock on it while it runs on the state dir
SOCKET_FILE = "sparkctl.sock"  # the daemon's API
STORE_FILE = "sparkctl.db"  # the state database


def default_state_dir(name: str = DEFAULT) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state")
    return base / "sparkctl" if name == DEFAULT else base / f"sparkctl-{name}"


def default_config_dir() -> Path:
    """The owner's stacks and image policy (XDG's config dir): one for every instance."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "sparkctl"


def resolve(name: str | None, state_dir: str | Path | None) -> tuple[str | None, Path | None]:
    """An instance and its state dir name each other: a named instance without a state dir gets
    its own, and a state dir without a named instance derives the name. An invalid name is
    passed on untouched (Settings refuses it with the rule)."""
    if isinstance(name, str) and name and not state_dir and re.match(PATTERN, name):
        return name, default_state_dir(name)
    if not name and state_dir:
        return derived(Path(state_dir), default_state_dir()), Path(state_dir)
    return name, Path(state_dir) if state_dir else None
