"""`sparkctl doctor`: whether this Spark is ready, before a first `up` spends minutes pulling.

Each check reads the host, the Docker engine, the registries, the Hub or this instance's state,
and starts nothing. It answers with `Check`s: ok, a warning, or a failure with the one command
that fixes it. The checks ask the same adapters `up` uses, so doctor reports the very error a
deploy would stop on, in seconds. `cli/doctor.py` runs them in the CLI's own process, since a
doctor must answer when no daemon runs. `scripts/host-setup.sh` runs the engine's checks after it
installs Docker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    area: str  # one of AREAS: what `--only` selects
    name: str  # what was checked: "docker", "stack qwen36-dflash", ...
    status: Status
    detail: str  # what was found, or what is wrong
    fix: str = ""  # the command (or step) that fixes it, for a warning or a failure

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": str(self.status)}


def ok(area: str, name: str, detail: str) -> Check:
    return Check(area, name, Status.OK, detail)


def warn(area: str, name: str, detail: str, fix: str) -> Check:
    return Check(area, name, Status.WARN, detail, fix)


def fail(area: str, name: str, detail: str, fix: str) -> Check:
    return Check(area, name, Status.FAIL, detail, fix)


@dataclass(frozen=True)
class Report:
    checks: tuple[Check, ...]

    @property
    def failed(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.status is Status.FAIL)

    def to_json(self) -> dict[str, Any]:
        return {"ok": not self.failed, "checks": [c.to_json() for c in self.checks]}


def examine(checks: Iterable[tuple[str, Callable[[], list[Check]]]], *, only: set[str] | None = None) -> Report:
    """Run each (area, check) of `only`'s areas (all by default), in order. A check that raises
    is reported as its area's failure: one broken check never hides the others."""
    found: list[Check] = []
    for area, check in checks:
        if only and area not in only:
            continue
        try:
            found += check()
        except Exception as e:  # noqa: BLE001 - the doctor reports what broke, and goes on
            found.append(fail(area, area, f"the check itself failed: {type(e).__name__}: {e}",
                              "report this with `sparkctl doctor --json`"))
    return Report(tuple(found))
