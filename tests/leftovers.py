"""What a test run left behind, found and swept at the end of its pytest session: processes that
carry the run's id in their environment (`tests.teardown.run_id`), and the network namespaces and
links the fleet harness named after it (tests/fleet/network.py). A failed test, or a benchmark
that its smoke test killed, may skip its own cleanup; the session's end is the backstop, and a
session that needed it fails (tests/conftest.py, `pytest_sessionfinish`).

Linux /proc and iproute2. Without root only this user's processes are seen, and a machine with no
namespaces has none to find.
"""

from __future__ import annotations

import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

from tests.fleet import network
from tests.fleet.hosts import sweep as sweep_tag
from tests.teardown import RUN_ENV

TAG_HEX = 4  # after the run's prefix, each tag's own part (network.run_tag)


@dataclass(frozen=True)
class Leftovers:
    namespaces: tuple[str, ...] = ()
    links: tuple[str, ...] = ()
    processes: tuple[tuple[int, str], ...] = ()  # (pid, command line)

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links or self.processes)

    def describe(self) -> list[str]:
        """One line per kind of leftover, naming each (processes by pid and command line)."""
        lines = []
        if self.namespaces:
            lines.append(f"{len(self.namespaces)} network namespace(s): {', '.join(self.namespaces)}")
        if self.links:
            lines.append(f"{len(self.links)} link(s): {', '.join(self.links)}")
        if self.processes:
            lines.append(f"{len(self.processes)} process(es): "
                         + "; ".join(f"{pid} {command[:120]}" for pid, command in self.processes))
        return lines

    def tags(self, run: str) -> set[str]:
        """The fleet-harness tags these namespaces and links were named after."""
        prefix = network.TAG_PREFIX + run
        return {name[:len(prefix) + TAG_HEX] for name in (*self.namespaces, *self.links)}


def check(run: str) -> list[str]:
    """Find what run `run` left, sweep it, and say what was found (and what outlived the sweep)."""
    left = find(run)
    if not left:
        return []
    sweep(left, run)
    return ([f"left by the run (swept now): {line}" for line in left.describe()]
            + [f"still there after the sweep: {line}" for line in find(run).describe()])


def find(run: str) -> Leftovers:
    """Everything of run `run` that still exists."""
    prefix = network.TAG_PREFIX + run
    namespaces = sorted(p.name for p in network.NETNS_DIR.iterdir() if p.name.startswith(prefix)) \
        if network.NETNS_DIR.is_dir() else []
    links = network.links(prefix) if shutil.which("ip") else []
    return Leftovers(tuple(namespaces), tuple(links), tuple(marked(run)))


def sweep(left: Leftovers, run: str) -> None:
    """Remove what `find` found: each tag's namespaces, links, cgroups, processes and files (the
    fleet harness's own sweep), then every other process of the run, by SIGKILL."""
    for tag in sorted(left.tags(run)):
        sweep_tag(tag)
    for pid, _ in marked(run):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def marked(run: str) -> list[tuple[int, str]]:
    """Live processes whose environment holds this run's id, but this process and its ancestors."""
    mark, spared = f"{RUN_ENV}={run}".encode(), _ancestors()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                found.append((int(entry.name), command))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids
