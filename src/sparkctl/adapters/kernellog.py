"""The kernel log, read-only, as the sentinel reads it: `/dev/kmsg` (Ubuntu's
`kernel.dmesg_restrict=1` makes it need CAP_SYSLOG: root, or a unit that grants it), else
`journalctl -k --follow` (members of `adm` or `systemd-journal`), or a path the setting names (a
file tests append to, a FIFO). Opened at its end: only lines written from then on are read.

`/dev/kmsg`, the journal's pipe and a FIFO are pollable: the daemon waits on their descriptor
on its event loop and reads what is there without blocking. A regular file is not (epoll refuses
it): it is followed by reading what was appended, every `FOLLOW` seconds. `doctor` asks `probe`
which source this user can read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

KMSG = Path("/dev/kmsg")
FOLLOW = 0.2  # s between two reads of a followed regular file (tests, not a Spark's /dev/kmsg)
JOURNAL = ("journalctl", "--dmesg", "--follow", "--lines=0", "--output=cat", "--quiet", "--no-pager")


@dataclass
class KernelLog:
    """One open source: `read()` returns the whole lines there now (never waits)."""

    source: str  # what is read, for the log and doctor ("/dev/kmsg", "journalctl -k", a path)
    fd: int
    pollable: bool
    process: subprocess.Popen | None = None
    _partial: bytes = field(default=b"", repr=False)
    records: bool = False  # /dev/kmsg: each read is one record
    ended: bool = False  # a pollable source that will say nothing more (journalctl exited)

    def read(self) -> list[str]:
        lines: list[str] = []
        while True:
            try:
                chunk = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:  # /dev/kmsg: records were overwritten before we read them
                continue
            if not chunk:
                self.ended = self.pollable  # a pipe's writer is gone; a regular file is only at its end
                break
            if self.records:
                lines.append(chunk.decode(errors="replace").rstrip("\n"))
                continue
            self._partial += chunk
            *whole, self._partial = self._partial.split(b"\n")
            lines += [w.decode(errors="replace") for w in whole]
        return lines

    def close(self) -> None:
        if self.process is None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            return
        self.process.kill()
        self.process.wait()
        assert self.process.stdout is not None
        self.process.stdout.close()


def open_log(setting: str) -> KernelLog | str:
    """The source `setting` names ("auto": /dev/kmsg, else the journal; "none"; a path), open at
    its end; or why none can be read."""
    if setting == "none":
        return "the kernel log is not read (SPARKCTL_KERNEL_LOG=none)"
    if setting != "auto":
        return _path(Path(setting))
    kmsg = _path(KMSG)
    if isinstance(kmsg, KernelLog):
        return kmsg
    journal = _journal()
    if isinstance(journal, KernelLog):
        return journal
    return (f"{kmsg}; {journal}: give the daemon CAP_SYSLOG (run it as root, or `AmbientCapabilities=CAP_SYSLOG` "
            "in its unit) or add its user to the adm group")


def probe(setting: str) -> tuple[str | None, str]:
    """Which source the sentinel would read (None: none) and what was found; opens and closes it."""
    opened = open_log(setting)
    if isinstance(opened, str):
        return None, opened
    opened.close()
    return opened.source, f"reads {opened.source}"


def _path(path: Path) -> KernelLog | str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except PermissionError:
        return f"{path} is not readable by this user (kernel.dmesg_restrict needs CAP_SYSLOG)"
    except OSError as e:
        return f"{path} cannot be opened: {e.strerror}"
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode):
        os.lseek(fd, 0, os.SEEK_END)
    return KernelLog(str(path), fd, pollable=not stat.S_ISREG(mode), records=stat.S_ISCHR(mode))


def _journal() -> KernelLog | str:
    if shutil.which("journalctl") is None:
        return "journalctl is not installed"
    try:
        seen = subprocess.run(["journalctl", "--dmesg", "--lines=1", "--output=cat", "--quiet", "--no-pager"],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"journalctl -k failed: {e}"
    if seen.returncode != 0 or not seen.stdout.strip():
        return "journalctl -k shows this user no kernel messages (not in adm or systemd-journal)"
    process = subprocess.Popen(JOURNAL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    assert process.stdout is not None
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    return KernelLog("journalctl -k", fd, pollable=True, process=process)
