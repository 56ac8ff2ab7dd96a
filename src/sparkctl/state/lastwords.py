"""The sentinel's last words (`lastwords.jsonl` in the state dir): one small JSON record a second
(memory, each engine's state, the last kernel warnings), appended and fsync'd, so that after a
host wedge and a power cycle the last minute before the freeze is on disk. The file is rotated at
`LIMIT` bytes (the older half kept as `lastwords.1.jsonl`), so it never holds more than about
twice that. A daemon that stops cleanly appends a `stopped` record; a daemon that starts and finds
a run that did not end so moves its records to `lastwords.previous.jsonl`, which `sparkctl doctor`
and `sparkctl status` show.

The daemon's sentinel is the one writer (`LastWords`); `previous` is read by anyone.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE, OLDER, PREVIOUS = "lastwords.jsonl", "lastwords.1.jsonl", "lastwords.previous.jsonl"
LIMIT = 64 * 1024  # bytes of the current file before it is rotated: well over a minute of records
SHOWN = 60  # records of a previous run shown: its last minute


@dataclass(frozen=True)
class Ending:
    """A daemon run that did not stop cleanly, by its last records (oldest first)."""

    records: tuple[dict[str, Any], ...]
    path: Path

    @property
    def last(self) -> dict[str, Any]:
        return self.records[-1]

    def summary(self) -> str:
        """One line: when it went silent, what memory and the kernel said last."""
        last = self.last
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(last.get("at", 0)))
        engines = ", ".join(f"{s} {state}" for s, state in sorted((last.get("engines") or {}).items())) or "none"
        kernel = (last.get("kernel") or ["none"])[-1]
        lowest = min((r["available_gib"] for r in self.records if "available_gib" in r), default=None)
        low = f", lowest {lowest:.2f} GiB in its last minute" if lowest is not None else ""
        return (f"the previous daemon run did not stop cleanly: its last record is from {when}, with "
                f"MemAvailable {last.get('available_gib', '?')} GiB{low}; engines: {engines}; last kernel "
                f"warning: {kernel} ({len(self.records)} records in {self.path})")


class LastWords:
    """The writer: one per daemon, on the sentinel's tick (a worker thread)."""

    def __init__(self, state_dir: Path, *, limit: int = LIMIT) -> None:
        self.dir, self.limit = state_dir, limit
        self._fd: int | None = None
        self._size = 0
        self._lock = threading.Lock()  # the tick's worker thread, and the daemon's stop on its loop

    def begin(self) -> Ending | None:
        """At the daemon's start: a run that did not stop cleanly is kept as the previous one
        (and returned); a clean one is forgotten, with any older previous run."""
        ending = _unclean(self.dir / OLDER, self.dir / FILE)
        if ending is not None:
            _write(self.dir / PREVIOUS, ending.records)
            ending = Ending(ending.records, self.dir / PREVIOUS)
        elif (self.dir / FILE).exists():
            (self.dir / PREVIOUS).unlink(missing_ok=True)
        for name in (FILE, OLDER):
            (self.dir / name).unlink(missing_ok=True)
        return ending

    def append(self, record: dict[str, Any]) -> None:
        """One record, on disk when this returns (fsync'd)."""
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            if self._fd is None or self._size + len(line) > self.limit:
                self._rotate()
            assert self._fd is not None
            os.write(self._fd, line)
            os.fsync(self._fd)
            self._size += len(line)

    def stopped(self) -> None:
        """The daemon stops cleanly: its last words are not a freeze's."""
        self.append({"at": round(time.time(), 3), "stopped": "cleanly"})
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _rotate(self) -> None:
        self._close()
        current = self.dir / FILE
        if current.exists() and current.stat().st_size:
            os.replace(current, self.dir / OLDER)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(current, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size


def previous(state_dir: Path, *, daemon_running: bool) -> Ending | None:
    """The last daemon run that did not stop cleanly: the one a starting daemon kept, or, when no
    daemon runs now, the current file's when it has no `stopped` record (killed, or the host froze)."""
    if not daemon_running and (current := _unclean(state_dir / OLDER, state_dir / FILE)) is not None:
        return current
    kept = _records(state_dir / PREVIOUS)
    return Ending(tuple(kept[-SHOWN:]), state_dir / PREVIOUS) if kept else None


def _unclean(*paths: Path) -> Ending | None:
    records = [r for p in paths for r in _records(p)]
    if not records or records[-1].get("stopped"):
        return None
    return Ending(tuple(records[-SHOWN:]), paths[-1])


def _records(path: Path) -> list[dict[str, Any]]:
    """The file's records; a line cut by the freeze (or not JSON) is skipped."""
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            found.append(record)
    return found


def _write(path: Path, records: tuple[dict[str, Any], ...]) -> None:
    tmp = path.with_suffix(".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        out.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
