"""The processes one `ray start` left behind, found and stopped by the session it ran in.

`ray start` daemonizes a node's processes (GCS, raylet, agents, monitors), and none of them
leaves the session they inherit. So the Ray adapter starts it as a new session leader and
records every process of that session, with its start time. Stopping signals exactly those
(and any later member of the same session, once a recorded one proves the session is still
ours): never `ray stop` or a name pattern, which reach Ray processes that belong to someone
else on the machine. Linux `/proc` only; stdlib only.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")


@dataclass(frozen=True)
class Proc:
    pid: int
    started: int  # clock ticks after boot (/proc/PID/stat field 22): a reused pid differs here


@dataclass(frozen=True)
class Session:
    """The processes of one node: the session id they share and those recorded at start."""

    sid: int
    procs: tuple[Proc, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"sid": self.sid, "procs": [[p.pid, p.started] for p in self.procs]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        return cls(sid=int(data["sid"]), procs=tuple(Proc(int(pid), int(started)) for pid, started in data["procs"]))


def recorded(sid: int) -> Session:
    """Every live process of session `sid`, as of now."""
    return Session(sid=sid, procs=tuple(members(sid)))


def members(sid: int) -> list[Proc]:
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None and stat[0] == sid:
                found.append(Proc(int(entry.name), stat[1]))
    return found


def alive(session: Session) -> list[Proc]:
    """The session's processes still running: the recorded ones whose start time matches, and,
    when at least one of those lives (so the session id has not been reused), any other member."""
    still = [p for p in session.procs if _same(p, session.sid)]
    if not still:
        return []
    return sorted(set(still) | set(members(session.sid)), key=lambda p: p.pid)


def stop(session: Session, *, grace: float, sig: signal.Signals = signal.SIGTERM) -> list[int]:
    """Signal the session's live processes, wait up to `grace` seconds for them to exit, then
    SIGKILL what is left. Returns the pids signalled; waits on /proc, bounded."""
    targets = alive(session)
    _signal(targets, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_same(p, session.sid) for p in targets):
        time.sleep(0.05)
    _signal([p for p in targets if _same(p, session.sid)], signal.SIGKILL)
    _reap(targets)
    return [p.pid for p in targets]


def _signal(procs: Iterable[Proc], sig: signal.Signals) -> None:
    for proc in procs:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass


def _reap(procs: list[Proc]) -> None:
    """Wait (bounded) until a SIGKILLed process is gone from /proc, so a caller sees it dead."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_running(p) for p in procs):
        time.sleep(0.02)


def _same(proc: Proc, sid: int) -> bool:
    stat = _stat(proc.pid)
    return stat is not None and stat == (sid, proc.started) and not _zombie(proc.pid)


def _running(proc: Proc) -> bool:
    stat = _stat(proc.pid)
    return stat is not None and stat[1] == proc.started and not _zombie(proc.pid)


def _stat(pid: int) -> tuple[int, int] | None:
    """(session id, start time) of `pid`, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return int(fields[3]), int(fields[19])


def _zombie(pid: int) -> bool:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return True
    return text[text.rindex(")") + 2:].startswith("Z")
