"""Parsed files kept between calls: in this process, and in the state dir for the next one.

A value is kept under a key that names everything it was made from (each file's name, inode,
size and modification time, plus sparkctl's and pydantic's versions and the spec code's own
signature), so an edit, an upgrade or a new file makes it again. A CLI call that finds its key
neither parses YAML nor builds the models' validators (docs/perf.md)."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pydantic

from sparkctl import __version__

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


def cached(file: Path, key: tuple, make: Callable[[], T], kind: type[T]) -> T:
    """The value `make()` returns for `key`, made again only when the key changed."""
    key = (*key, CODE)
    held = _held.get(file)
    if held is not None and held[0] == key:
        return held[1]
    value = _read(file, key, kind)
    if value is None:
        value = make()
        _write(file, key, value)
    _held[file] = (key, value)
    return value


def _read(file: Path, key: tuple, kind: type[T]) -> T | None:
    """Only a file this user wrote and nobody else may write is read: unpickling runs what the
    file says."""
    try:
        with file.open("rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o077:
                return None
            held_key, value = pickle.load(f)
    except Exception:  # noqa: BLE001 - missing, torn or from other code: make it again
        return None
    return value if held_key == key and isinstance(value, kind) else None


def _write(file: Path, key: tuple, value: Any) -> None:
    try:
        file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        scratch = file.with_name(f".{file.name}.{os.getpid()}")
        with os.fdopen(os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            pickle.dump((key, value), f, protocol=pickle.HIGHEST_PROTOCOL)
        scratch.replace(file)
    except OSError:  # a read-only state dir: every call makes it, as before
        pass


_held: dict[Path, tuple[tuple, Any]] = {}  # this process's values, by file
# What a kept value was made by: a new sparkctl, pydantic or edited spec code makes it again.
CODE = (__version__, pydantic.VERSION,
        *((p.name, s.st_size, s.st_mtime_ns) for p in sorted(Path(__file__).parent.glob("*.py")) if (s := p.stat())))
