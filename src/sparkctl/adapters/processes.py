"""Processes as Linux's `/proc` reports them: those one `ray start` left behind, the sockets a
container's processes listen on, and this process's own limit on open files.

`ray start` leaves processes found and stopped by the session it ran in.

`ray start` daemonizes a node's processes (GCS, raylet, agents, monitors), and none of them
leaves the session they inherit. So the Ray adapter starts it as a new session leader and
records every process of that session, with its start time. Stopping signals exactly those
(and any later member of the same session, once a recorded one proves the session is still
ours): never `ray stop` or a name pattern, which reach Ray processes that belong to someone
else on the machine. Linux `/proc` only; stdlib only.

What a container listens on is read from the kernel, never from its command line: each of its
processes' socket inodes (`/proc/PID/fd`) matched to the listening TCP sockets of that process's
network namespace (`/proc/PID/net/tcp`, `tcp6`). With host networking that namespace is the host's,
so the inodes are what tell the container's sockets from everyone else's. Reading another user's
`/proc/PID/fd` needs root (or CAP_SYS_PTRACE).

Who holds a port is read the same way, across every process this user may read: what the daemon
names when its gateway's port is taken, and `doctor`'s port check.

The limit on open files is raised by the long-lived processes that hold many connections (the
daemon's gateway, a host agent's relays) at their start.
"""

from __future__ import annotations

import ipaddress
import os
import resource
import select
import signal
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkctl.errors import SparkctlError

PROC = Path("/proc")
LISTEN = "0A"  # the TCP state /proc/net/tcp gives a listening socket


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


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket and the process that holds it."""

    address: str
    port: int
    pid: int

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach it (127.0.0.0/8, ::1, or IPv4-mapped loopback)."""
        ip = ipaddress.ip_address(self.address)
        return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback

    def __str__(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


def listening(pids: Iterable[int]) -> list[Listener]:
    """The listening TCP sockets the processes `pids` hold, as the kernel reports them (a socket
    shared by several of them once). A process that ended meanwhile holds none."""
    found: dict[int, Listener] = {}
    for pid in pids:
        try:
            inodes = _socket_inodes(pid)
            table = _namespace(PROC / str(pid) / "net")
        except (FileNotFoundError, ProcessLookupError):
            continue
        except PermissionError as e:
            raise SparkctlError(f"read the sockets of process {pid}: {e.strerror} ({e.filename}); what a container "
                                "listens on is read from /proc, which needs root: run the host's sparkctl (its "
                                "`fleet init` or `fleet join`, whose Ray runs the agent) as root") from None
        for inode in inodes & table.keys():
            found.setdefault(inode, Listener(*table[inode], pid))
    return sorted(found.values(), key=lambda listener: (listener.port, listener.address, listener.pid))


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
    SIGKILL what is left and wait (5 s at most) until it has. Returns the pids signalled. Each
    process is held by a pidfd from the moment it is found ours: a reused pid is never signalled,
    and its exit is an event to wait on, not a state to poll."""
    handles = _handles(alive(session), session.sid)
    try:
        _signal(handles.values(), sig)
        left = _wait(handles, grace)
        _signal(left.values(), signal.SIGKILL)
        _wait(left, 5)
    finally:
        for handle in handles.values():
            os.close(handle)
    return [p.pid for p in handles]


def holders(port: int) -> list[tuple[int, str]]:
    """Every process this user may read that holds a socket listening on TCP `port` (any address
    of this network namespace): (pid, its command line, shortened)."""
    inodes = {inode for inode, (_, listened) in _namespace(PROC / "net").items() if listened == port}
    found = []
    for entry in PROC.iterdir() if inodes else ():
        try:
            if entry.name.isdigit() and _socket_inodes(int(entry.name)) & inodes:
                found.append((int(entry.name), _command(entry)))
        except OSError:  # it ended, or is not ours to read
            continue
    return found


def who_holds(port: int) -> str:
    """Who listens on TCP `port`, as a person would name it."""
    found = holders(port)
    if not found:
        return "another program (not readable by this user: `sudo ss -ltnp` names it)"
    return "another program (" + "; ".join(f"pid {pid}: {command}" for pid, command in found) + ")"


def open_files() -> int:
    """Raise the soft limit on open files to the hard one; the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def _handles(procs: list[Proc], sid: int) -> dict[Proc, int]:
    """A pidfd for each process that is still the one recorded (checked once the pidfd holds it)."""
    handles = {}
    for proc in procs:
        try:
            handle = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            continue
        if _same(proc, sid):
            handles[proc] = handle
        else:
            os.close(handle)
    return handles


def _signal(handles: Iterable[int], sig: signal.Signals) -> None:
    for handle in handles:
        try:
            signal.pidfd_send_signal(handle, sig)
        except ProcessLookupError:
            pass


def _wait(handles: dict[Proc, int], within: float) -> dict[Proc, int]:
    """Wait until every process has exited or `within` s passed; those still running."""
    deadline = time.monotonic() + within
    left = dict(handles)
    while left and (remaining := deadline - time.monotonic()) > 0:
        exits = select.poll()
        for handle in left.values():
            exits.register(handle, select.POLLIN)
        ended = {fd for fd, _ in exits.poll(remaining * 1000)}
        left = {proc: handle for proc, handle in left.items() if handle not in ended}
    return left


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets among the process's open files."""
    inodes = set()
    for fd in (PROC / str(pid) / "fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _namespace(net: Path) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of the listening TCP sockets of a network namespace (its `net/`
    folder in /proc); a namespace without IPv6 has no tcp6 table."""
    tables = [net / "tcp"] + [net / "tcp6"] * (net / "tcp6").exists()
    return {inode: found for table in tables for inode, found in _listening(table).items()}


def _command(entry: Path) -> str:
    try:
        argv = (entry / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(a.decode(errors="replace") for a in argv if a)
    return (text[:120] + "…") if len(text) > 120 else text or "?"


def _listening(table: Path) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of the listening sockets in one of /proc's TCP tables."""
    found = {}
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[3] == LISTEN:
            address, port = fields[1].split(":")
            found[int(fields[9])] = (_address(address), int(port, 16))
    return found


def _address(hexed: str) -> str:
    """An address as /proc's TCP tables print it: 32-bit words in the machine's byte order."""
    raw = bytes.fromhex(hexed)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, raw)


def _same(proc: Proc, sid: int) -> bool:
    stat = _stat(proc.pid)
    return stat is not None and stat == (sid, proc.started) and not _zombie(proc.pid)


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
