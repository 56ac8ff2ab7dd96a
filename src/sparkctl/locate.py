"""Where an instance's state lives: the files of its state dir, the default dir of an instance
(and of the owner's config), and how an instance and its state dir name each other (`Settings` resolves the pair with
`resolve`). Pure, stdlib only."""

from __future__ import annotations

import os
import re
from pathlib import Path

from sparkctl import instance as instances

LOCK_FILE = "daemon.lock"  # a daemon holds an exclusive lock on it while it runs on the state dir
SOCKET_FILE = "sparkctl.sock"  # the daemon's API
STORE_FILE = "sparkctl.db"  # the state database


def default_state_dir(name: str = instances.DEFAULT) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state")
    return base / "sparkctl" if name == instances.DEFAULT else base / f"sparkctl-{name}"


def default_config_dir() -> Path:
    """The owner's stacks and image policy (XDG's config dir): one for every instance."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "sparkctl"


def resolve(name: str | None, state_dir: str | Path | None) -> tuple[str | None, Path | None]:
    """An instance and its state dir name each other: a named instance without a state dir gets
    its own, and a state dir without a named instance derives the name. An invalid name is
    passed on untouched (Settings refuses it with the rule)."""
    if isinstance(name, str) and name and not state_dir and re.match(instances.PATTERN, name):
        return name, default_state_dir(name)
    if not name and state_dir:
        return instances.derived(Path(state_dir), default_state_dir()), Path(state_dir)
    return name, Path(state_dir) if state_dir else None
