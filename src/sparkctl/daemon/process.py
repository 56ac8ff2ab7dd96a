"""What the daemon needs from its process and host: the state dir's exclusive lock (and its stop
when the state dir is gone), a listening socket systemd hands over, the garbage collector kept off
the objects made at start, giving freed memory back, and saying when it serves (its limit on open
files is `adapters.processes`'). Called by `daemon/app.py` at start and after work."""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import gc
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import IO

import structlog

from sparkctl.errors import SparkctlError

log = structlog.get_logger()

LOOK_EVERY = 2.0  # s between two looks at the state dir's lock (a stat each): how soon a daemon sees its dir gone


def freeze_startup() -> None:
    """Put every object alive once the daemon has started (its modules, classes and wiring, ~73k)
    beyond the garbage collector's reach: a full collection walked them all, ~80 ms with the GIL
    held, after every reconcile pass and whenever the collector's thresholds tripped, stalling
    whatever the daemon did then (an `up`, a request through the gateway). What work allocates
    later is collected as before."""
    gc.collect()
    gc.freeze()


def give_back_memory() -> None:
    """Return freed heap to the OS after work: deploys allocate a lot, briefly, and a daemon
    that runs for weeks should not keep the high-water mark."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def handed_socket() -> socket.socket | None:
    """The gateway's listening socket when systemd hands it over (socket activation): it outlives
    the daemon, so clients that connect during a restart wait in its queue instead of failing."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()) or int(os.environ.get("LISTEN_FDS", "0")) < 1:
        return None
    return socket.socket(fileno=3)


def notify_ready() -> None:
    """Tell whoever started the daemon that it serves: systemd (`Type=notify`) or the CLI, by
    systemd's protocol (`READY=1` to the datagram socket NOTIFY_SOCKET names; `@` an abstract
    one). The variable is dropped, so nothing the daemon starts inherits it."""
    address = os.environ.pop("NOTIFY_SOCKET", "")
    if not address:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        try:
            notify.sendto(b"READY=1", "\0" + address[1:] if address.startswith("@") else address)
        except OSError:
            pass  # the starter is gone; nobody is waiting


def exclusive(path: Path) -> IO[str]:
    """Take the state dir's daemon lock (or say who has it); the open file holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - held for the daemon's lifetime
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "unknown"
        handle.close()
        raise already_runs(owner, path.parent) from None
    handle.truncate(0)
    handle.write(str(os.getpid()))
    handle.flush()
    return handle


def already_runs(pid: int | str, state_dir: Path) -> SparkctlError:
    """The refusal of a second daemon on a state dir, naming the first one's pid."""
    return SparkctlError(f"a sparkctl daemon (pid {pid}) already runs on {state_dir}; stop it first (`sparkctl "
                         "daemon --stop`), or give this one its own SPARKCTL_STATE_DIR")


async def stop_when_gone(lock: IO[str], stop: Callable[[], None]) -> None:
    """Call `stop` once the state dir is no longer this daemon's: the lock file it holds
    (`exclusive`) was removed, alone or with its dir (a test's temporary dir, a reset), or moved
    or replaced. Left running, the daemon would hold the gateway's port on a socket and a
    database nobody can reach, and a second daemon could start on the path beside it. Looked at
    every LOOK_EVERY s (one stat), not watched: a move of a parent dir is no event on the dir."""
    held = os.fstat(lock.fileno())
    while True:
        await asyncio.sleep(LOOK_EVERY)
        try:
            now = os.stat(lock.name)
        except (FileNotFoundError, NotADirectoryError):
            break
        if (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            break
    log.error("state_dir_gone", state_dir=str(Path(lock.name).parent),
              note="the daemon stops (its engines keep running); the next command starts one on a fresh state dir")
    stop()
