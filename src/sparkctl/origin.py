"""What this sparkctl was built from: the commit, for `sparkctl version`. A wheel carries it in
COMMIT_FILE, written at build time by the build hook (`hatch_build.py`, which asks `from_git`
here), so an installed sparkctl needs no git; a checkout asks git; otherwise it is unknown.
Stdlib only: the build hook loads this file on its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

COMMIT_FILE = "_commit.txt"  # beside this module in a built wheel (and in an sdist, for the wheel built from it)
UNKNOWN = "unknown"


def commit() -> str:
    """The commit baked in at build time, else the checkout's, else UNKNOWN."""
    try:
        return Path(__file__).with_name(COMMIT_FILE).read_text().strip() or UNKNOWN
    except FileNotFoundError:
        return from_git(Path(__file__).resolve().parents[2]) or UNKNOWN


def from_git(root: Path) -> str | None:
    """HEAD of the checkout at `root`, abbreviated, with `-dirty` when tracked files differ from it;
    None when `root` is not a checkout or git cannot say."""
    if not (root / ".git").exists():  # a file in a worktree, a dir in a clone
        return None
    try:
        head = _git(root, "rev-parse", "--short=12", "HEAD")
        changed = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if changed else head


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                          check=True).stdout.strip()
