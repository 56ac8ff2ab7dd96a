"""The live-neighbour guarantee, suite-wide: a test run never touches a container that is not a test
run's. At the session's start every such neighbour on the Docker engine is recorded (its ID, state,
start time and restart count); at the end, one that changed or went fails the session
(tests/conftest.py, `pytest_sessionfinish`), naming it and what changed.

A test run's containers carry the `sparkctl.test-run` label or belong to a throwaway instance that
tests.fakes.sandbox named (`test-`, `perf-`, `live-`, `demo-` and 8 hex): this run's are made
after the record, and another run's on the same engine come and go on their own. Everything else
(an owner's stacks on the default instance, any other container) is a neighbour to keep.

Only when a Docker engine answers: the unit and sim tiers run without one, and then nothing here
touches Docker.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TEST_LABEL = "sparkctl.test-run"
THROWAWAY = re.compile(r"(test|perf|live|demo)-[0-9a-f]{8}")  # sandbox.environment(prefix)'s instances


@dataclass(frozen=True)
class Neighbour:
    name: str
    status: str
    started_at: str
    restart_count: int


@dataclass(frozen=True)
class Watch:
    """The neighbours as a session found them, and the engine to look again with."""

    client: Any
    before: dict[str, Neighbour]

    @classmethod
    def start(cls) -> Watch | None:
        """Record the neighbours now; None when no Docker engine answers."""
        client = engine()
        return cls(client, record(client)) if client is not None else None

    def changes(self) -> list[str]:
        return changes(self.before, record(self.client))


def engine() -> Any | None:
    """A Docker client when an engine answers, else None (without trying when no socket is there)."""
    if not os.environ.get("DOCKER_HOST") and not Path("/var/run/docker.sock").exists():
        return None
    try:
        import docker

        client = docker.from_env(timeout=10)
        client.ping()
    except Exception:  # noqa: BLE001 - any failure means no engine to guard
        return None
    return client


def record(client: Any) -> dict[str, Neighbour]:
    """Every container on the engine that is not a test run's, by ID."""
    found = {}
    for listed in client.api.containers(all=True):
        if is_test_runs(listed.get("Labels") or {}):
            continue
        try:
            state = client.api.inspect_container(listed["Id"])
        except Exception:  # noqa: BLE001 - removed between the list and the inspect: not there
            continue
        found[listed["Id"]] = Neighbour(state["Name"].lstrip("/"), state["State"]["Status"],
                                        state["State"]["StartedAt"], state["RestartCount"])
    return found


def is_test_runs(labels: dict[str, str]) -> bool:
    return TEST_LABEL in labels or bool(THROWAWAY.fullmatch(labels.get("sparkctl.instance", "")))


def changes(before: dict[str, Neighbour], after: dict[str, Neighbour]) -> list[str]:
    """One line per neighbour recorded `before` that is gone or differs `after`."""
    lines = []
    for cid, was in before.items():
        now = after.get(cid)
        if now is None:
            lines.append(f"{was.name} ({cid[:12]}) is gone (was {was.status}, started {was.started_at})")
            continue
        moved = [f"{field} {getattr(was, field)!r} -> {getattr(now, field)!r}"
                 for field in ("status", "started_at", "restart_count") if getattr(was, field) != getattr(now, field)]
        if moved:
            lines.append(f"{was.name} ({cid[:12]}): " + ", ".join(moved))
    return lines
