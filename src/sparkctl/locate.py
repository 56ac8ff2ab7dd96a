"""Where an instance's state lives: the files of its state dir, the default dir of an instance,
how an instance and its state dir name each other (`Settings` resolves the pair with `resolve`),
and a hash of everything the settings are made from (an unchanged `up`'s record keeps it). Pure,
stdlib only."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from sparkctl import instance as instances

LOCK_FILE = "daemon.lock"  # a daemon holds an exclusive lock on it while it runs on the state dir
SOCKET_FILE = "sparkctl.sock"  # the daemon's API
STORE_FILE = "sparkctl.db"  # the state database


def default_state_dir(name: str = instances.DEFAULT) -> Path:
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local/state")
    return base / "sparkctl" if name == instances.DEFAULT else base / f"sparkctl-{name}"


def resolve(name: str | None, state_dir: str | Path | None) -> tuple[str | None, Path | None]:
    """An instance and its state dir name each other: a named instance without a state dir gets
    its own, and a state dir without a named instance derives the name. An invalid name is
    passed on untouched (Settings refuses it with the rule)."""
    if isinstance(name, str) and name and not state_dir and re.match(instances.PATTERN, name):
        return name, default_state_dir(name)
    if not name and state_dir:
        return instances.derived(Path(state_dir), default_state_dir()), Path(state_dir)
    return name, Path(state_dir) if state_dir else None


def inputs(environ: Mapping[str, str] = os.environ, env_file: Path = Path(".env")) -> str:
    """A hash of everything the settings are made from (the `SPARKCTL_*`, Hub, Docker and XDG
    variables, `.env`, the working directory relative paths resolve in): equal hashes, equal
    settings. Only the hash is ever kept, never a token."""
    import hashlib

    read = sorted((k.upper(), v) for k, v in environ.items()
                  if k.upper().startswith(("SPARKCTL_", "HF_", "DOCKER_", "XDG_"))
                  or k.upper() in ("HOME", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACE_TOKEN"))
    digest = hashlib.sha256(repr((read, os.getcwd())).encode())
    if env_file.is_file():
        digest.update(env_file.read_bytes())
    return digest.hexdigest()
