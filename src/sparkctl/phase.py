"""The phases a deployment goes through, from resolving its image to serving (or failing):
the pipeline reports them, the store records them, the CLI and the daemon show them. Plain model."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    RESOLVING = "resolving"
    PULLING = "pulling"
    FETCHING = "fetching"
    PATCHING = "patching"
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    CANARY = "canary"
    RUNNING = "running"  # terminal success: healthy and serving
    FETCHED = "fetched"  # terminal: `pull` fetched and patched what it needs, and started nothing
    FAILED = "failed"
    STOPPED = "stopped"

    def is_terminal(self) -> bool:
        return self in (Phase.RUNNING, Phase.FETCHED, Phase.FAILED, Phase.STOPPED)
