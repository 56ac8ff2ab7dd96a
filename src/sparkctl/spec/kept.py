"""Parsed files kept in this process (the daemon's), made again when a file they came from changed.

A value is kept under a key that names everything it was made from (each file's name, inode, size
and modification time), so an edit, or a new or removed file, makes it again at the next call."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def signature(*paths: Path | None) -> tuple:
    """What the files at `paths` (a folder: its `*.yaml`) are now; raises OSError if one went
    away while looked at."""
    found = []
    for path in paths:
        if path is None or not path.exists():
            found.append(())
        else:
            files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
            found.append(tuple((p.name, s.st_ino, s.st_size, s.st_mtime_ns) for p in files if (s := p.stat())))
    return tuple(found)


def cached(what: str, key: tuple, make: Callable[[], T]) -> T:
    """The value `make()` returns for `key`, made again only when the key changed."""
    held = _held.get(what)
    if held is not None and held[0] == key:
        return held[1]
    value = make()
    _held[what] = (key, value)
    return value


_held: dict[str, tuple[tuple, Any]] = {}  # this process's values, by what they are
