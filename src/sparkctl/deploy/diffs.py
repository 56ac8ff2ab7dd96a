"""Apply unified diffs (users' own patches) to file contents, strictly.

Each hunk must match its context exactly, at its line or within a small offset; otherwise the
deploy stops before any container starts, naming the file and the hunk. Pure; called by
`deploy/patches.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sparkctl.errors import SparkctlError

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
FUZZ = 50  # how far from its stated line a hunk may be found


class DiffError(SparkctlError):
    """A diff is malformed or does not apply."""


@dataclass(frozen=True)
class FileDiff:
    path: str  # as named by the diff's +++ line, without a/ b/ prefixes
    hunks: tuple[tuple[int, tuple[str, ...]], ...]  # (old start line, lines with ' ', '-', '+')


def parse(text: str, *, source: str = "<diff>") -> list[FileDiff]:
    """The per-file parts of a unified diff."""
    files: list[FileDiff] = []
    path, hunks, current = None, [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("+++ "):
            if path is not None:
                files.append(FileDiff(path, tuple(hunks)))
            path, hunks, current = line[4:].split("\t")[0].strip(), [], None
            path = path[2:] if path[:2] in ("a/", "b/") else path
        elif line.startswith("--- ") and current is None:
            continue
        elif (match := _HUNK.match(line)) is not None:
            if path is None:
                raise DiffError(f"{source}:{number}: hunk before any +++ file header")
            current = []
            hunks.append((int(match[1]), current))
        elif current is not None and line[:1] in (" ", "-", "+", ""):
            current.append(line if line else " ")
        elif current is not None and line.startswith("\\"):
            continue  # "\\ No newline at end of file"
    if path is not None:
        files.append(FileDiff(path, tuple(hunks)))
    if not files:
        raise DiffError(f"{source}: no file changes found (expected a unified diff with ---/+++ headers)")
    return [FileDiff(f.path, tuple((start, tuple(lines)) for start, lines in f.hunks)) for f in files]


def apply(content: str, diff: FileDiff, *, source: str = "<diff>") -> str:
    """`content` with every hunk of `diff` applied; DiffError names the hunk that fails."""
    lines = content.splitlines(keepends=True)
    shift = 0
    for number, (start, hunk) in enumerate(diff.hunks, 1):
        old = [h[1:] for h in hunk if h[0] in " -"]
        new = [h[1:] for h in hunk if h[0] in " +"]
        at = _locate(lines, old, start - 1 + shift)
        if at is None:
            preview = (old[0] if old else "").strip()[:60]
            raise DiffError(f"{source}: hunk {number} (at line {start}, starting {preview!r}) does not apply "
                            f"to {diff.path}; the file in this image differs from the one the diff was made for")
        ending = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
        lines[at:at + len(old)] = [line + ending for line in new]
        shift += len(new) - len(old)
    return "".join(lines)


def _locate(lines: list[str], old: list[str], guess: int) -> int | None:
    stripped = [line.rstrip("\r\n") for line in lines]
    for offset in range(FUZZ + 1):
        for at in {guess - offset, guess + offset}:
            if 0 <= at <= len(stripped) - len(old) and stripped[at:at + len(old)] == old:
                return at
    return None
