"""Reading YAML a user, or an attacker, may have dropped into the stacks or state dir.

ruamel's C parser recurses without a bound: ~30,000 nested `[` crash the process. So files are
parsed by its pure-Python parser, where deep nesting is a RecursionError, and files over 1 MiB
are refused. Aliases are cheap to write and expensive to expand (a 600-byte "billion laughs"
took minutes to render): a document that would expand to more than `MAX_VALUES` values is
refused. Every refusal is a `SpecError` naming the file; `line_of` places a key's error on its
line. Used by the stack loader, the image policy file and desired.yaml.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkctl.errors import SpecError

MAX_BYTES = 1 << 20
MAX_VALUES = 100_000


def read(path: Path) -> Any:
    """Parse one YAML file into plain values."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), "", f"cannot read: {e}") from None
    if len(text) > MAX_BYTES:
        raise SpecError(str(path), "", f"{len(text)} bytes: over the {MAX_BYTES >> 20} MiB a sparkctl file may hold")
    from ruamel.yaml import YAML  # only when a file is read
    from ruamel.yaml.error import YAMLError

    try:
        data = YAML(typ="safe", pure=True).load(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(str(path), "", f"invalid YAML: {problem}", line=mark.line + 1 if mark else None) from None
    except RecursionError:
        raise SpecError(str(path), "", f"nested too deeply (over {sys.getrecursionlimit() // 4} levels)") from None
    if expanded_size(data) > MAX_VALUES:
        raise SpecError(str(path), "", f"expands to over {MAX_VALUES} values through YAML aliases; "
                                       "write the values out instead")
    return data


def line_of(path: Path, keys: Sequence[str]) -> int | None:
    """The line where `path` writes the dotted key `keys` (list items by index), or the deepest
    part of it the file writes; None when it does not write the first (a key from a base stack,
    or the top level). Parses again, keeping positions: only when an error needs placing, and only
    a file `read` took, so its size and aliases are bounded."""
    from ruamel.yaml import YAML

    try:
        node = YAML(typ="rt", pure=True).load(path.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - the error is reported without a line
        return None
    line = None
    for key in keys:
        if isinstance(node, Mapping) and key in node:
            line, node = node.lc.key(key)[0] + 1, node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            line, node = node.lc.item(int(key))[0] + 1, node[int(key)]
        else:
            break
    return line


def expanded_size(data: Any) -> int:
    """How many values `data` holds once every alias is expanded (stops counting past MAX_VALUES)."""
    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        children = node.values() if isinstance(node, Mapping) else node if isinstance(node, list) else ()
        total = 1
        for child in children:
            total += size(child)
            if total > MAX_VALUES:
                break
        sizes[id(node)] = total
        return total

    return size(data)
