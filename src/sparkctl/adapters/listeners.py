"""Which processes listen on a TCP port, from /proc: the listening sockets' inodes in
/proc/net/tcp and tcp6, against every process's open files. Answers what `ss -ltnp` would, with no
tool installed; a process that is not ours to read (another user's, without root) is left out.
Used by the daemon when its gateway's port is taken, and by `doctor`'s port check."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Listener:
    pid: int
    command: str  # its command line, shortened

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command})"


def listening(port: int) -> set[str]:
    """The inodes of the sockets listening on TCP `port` (any address), as `socket:[N]`."""
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (PROC / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    return inodes


def holds(pid: int, inodes: set[str]) -> bool:
    """Whether process `pid` has one of the sockets open."""
    try:
        return any(os.readlink(fd) in inodes for fd in (PROC / str(pid) / "fd").iterdir())
    except OSError:
        return False  # it ended, or is not ours to read


def holders(port: int) -> list[Listener]:
    """Every process (that this user may read) holding a socket that listens on TCP `port`."""
    inodes = listening(port)
    if not inodes:
        return []
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit() and holds(int(entry.name), inodes):
            found.append(Listener(int(entry.name), _command(entry)))
    return found


def _command(entry: Path) -> str:
    try:
        argv = (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    return (text[:120] + "…") if len(text) > 120 else text or "?"
