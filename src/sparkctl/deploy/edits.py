"""How a patch set changes a file's text, on the host: unified diffs (users' own patches) and
the class-attribute shim. Pure; called by `deploy/patches.py`, which checks each result.

A diff applies strictly: each hunk must match its context exactly, at its line or within a small
offset; otherwise the deploy stops before any container starts, naming the file and the hunk.

The shim inserts class-level defaults into a class of a Python source file: the DFlash shim gives
`DFlashProposer` `_draft_kv_cache_group_ids = ()` and `_draft_layer_to_kv_cache_gid = {}`. The
class is found through the syntax tree, never by line number; attributes already assigned at
class level are left alone (so re-applying is a no-op); every other byte of the file stays as it
was; the result is parsed again before it is used.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
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


def parse_diff(text: str, *, source: str = "<diff>") -> list[FileDiff]:
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


def apply_diff(content: str, diff: FileDiff, *, source: str = "<diff>") -> str:
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

class ShimError(SparkctlError):
    """The shim cannot apply: the file, class or value is not what it expects."""


def apply_shim(source: str, class_name: str, attributes: Mapping[str, str], *, filename: str = "<file>") -> str:
    """`source` with `attributes` (name -> Python expression) as class-level assignments."""
    cls = _find_class(_parse(source, filename), class_name, filename)
    missing = {name: value for name, value in attributes.items() if name not in _class_names(cls)}
    if not missing:
        return source
    for name, value in missing.items():
        _check_expression(value, name, filename)
    first = cls.body[0]
    has_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str)
    if first.lineno == cls.lineno:
        raise ShimError(f"{filename}: class {class_name} has its body on the header line; cannot shim it")
    start = min([first.lineno, *(d.lineno for d in getattr(first, "decorator_list", []))])
    anchor = first.end_lineno if has_docstring else start - 1  # insert after this many lines
    lines = source.splitlines(keepends=True)
    indent = " " * first.col_offset
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    insertion = [f"{indent}{name} = {value}{newline}" for name, value in missing.items()]
    result = "".join(lines[:anchor] + insertion + lines[anchor:])
    _verify(result, class_name, attributes, filename)
    return result


def _parse(source: str, filename: str) -> ast.Module:
    try:
        return ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise ShimError(f"{filename}: not valid Python (line {e.lineno}: {e.msg}); cannot apply the shim") from None


def _find_class(tree: ast.Module, class_name: str, filename: str) -> ast.ClassDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name]
    if not found:
        classes = sorted({n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)})
        raise ShimError(f"{filename}: no class {class_name!r} to shim (classes here: {', '.join(classes) or 'none'}); "
                        "the image's vLLM differs from the one the patch set was written for")
    if len(found) > 1:
        raise ShimError(f"{filename}: class {class_name!r} is defined {len(found)} times; refusing to guess")
    return found[0]


def _class_names(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in cls.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _check_expression(value: str, name: str, filename: str) -> None:
    try:
        ast.parse(value, mode="eval")
    except SyntaxError:
        raise ShimError(f"{filename}: shim value for {name} is not a Python expression: {value!r}") from None


def _verify(result: str, class_name: str, attributes: Mapping[str, str], filename: str) -> None:
    cls = _find_class(_parse(result, filename), class_name, filename)
    absent = set(attributes) - _class_names(cls)
    if absent:
        raise ShimError(f"{filename}: after the shim, {class_name} still lacks {sorted(absent)}")
