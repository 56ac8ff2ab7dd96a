"""Reading YAML a user, or an attacker, may have dropped into the stacks or state dir.

ruamel's C parser recurses without a bound: ~30,000 nested `[` crash the process. So files are
parsed by its pure-Python parser, where deep nesting is a RecursionError, and files over 1 MiB
are refused. The reader builds only what a sparkctl file holds: mappings, lists, text, booleans,
null, floats and integers Python can write back in decimal (4,300 digits: JSON, a hash, an error
message all do). A date stays the text it is written as (Docker is given text; the models parse
the dates they take); any other tag is refused, and so is a value its constructor cannot build
(`!!int abc`, 5,000 digits) and a number written with over `MAX_DIGITS` characters (YAML 1.1's
base-60 integers cost quadratic time to build). Aliases are cheap to write and expensive to
expand (a 600-byte "billion laughs" took minutes to render; a 0.21 MB file of aliases to one long
string hashed as 829 MB): a document that would expand to more than `MAX_VALUES` values, or to
more text than a file may hold, is refused, and so is one that holds itself. Every refusal is a
`SpecError` naming the file, with its line when known: a caller's per-file isolation holds
whatever the file says. `line_of` places a key's error on its line. Used by the stack loader,
the image policy files, fleet.yaml and desired.yaml.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sparkctl.errors import SpecError

MAX_BYTES = 1 << 20
MAX_VALUES = 100_000
MAX_DIGITS = 4_300  # Python's own bound on converting between an int and its decimal text
_DECIMAL_BOUND = 10**MAX_DIGITS


def read(path: Path) -> Any:
    """Parse one YAML file into plain values."""
    return parse(path, _text(path))


def parse(path: Path, text: str) -> Any:
    """`text` parsed as `read` parses a file; `path` names where it came from in an error."""
    if len(text) > MAX_BYTES:
        raise SpecError(str(path), "", f"{len(text)} bytes: over the {MAX_BYTES >> 20} MiB a sparkctl file may hold")
    return _parse(path, text)


def line_of(path: Path, keys: Sequence[str]) -> int | None:
    """The line where `path` writes the dotted key `keys` (list items by index), or the deepest
    part of it the file writes; None when it does not write the first (a key from a base stack,
    or the top level). Parses again, keeping positions and building no value (a value the file
    cannot hold must not hide where it is): only when an error needs placing, and only a file
    `read` took, so its size is bounded."""
    from ruamel.yaml import YAML
    from ruamel.yaml.nodes import MappingNode, SequenceNode

    try:
        node = YAML(typ="safe", pure=True).compose(path.read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001 - the error is reported without a line
        return None
    line = None
    for key in keys:
        if isinstance(node, MappingNode):
            found = next(((k, v) for k, v in node.value if k.value == key), None)
        elif isinstance(node, SequenceNode) and key.isdigit() and int(key) < len(node.value):
            found = node.value[int(key)], node.value[int(key)]
        else:
            found = None
        if found is None:
            break
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def expanded_size(data: Any) -> tuple[int, int]:
    """How many values `data` holds once every alias is expanded, and how many characters of text
    (keys included); counting stops past `MAX_VALUES` values or `MAX_BYTES` characters. A value
    that holds itself is a ValueError."""
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()

    def size(node: Any) -> tuple[int, int]:
        if id(node) in sizes:
            return sizes[id(node)]
        if isinstance(node, str):
            return 1, len(node)
        if id(node) in open_:
            raise ValueError("holds itself through a YAML alias")
        open_.add(id(node))
        children = [*node.keys(), *node.values()] if isinstance(node, Mapping) else \
            node if isinstance(node, (list, tuple)) else ()  # a tuple: a list written as a key
        values, chars = 1, 0
        for child in children:
            more, text = size(child)
            values, chars = values + more, chars + text
            if values > MAX_VALUES or chars > MAX_BYTES:
                break
        open_.discard(id(node))
        sizes[id(node)] = values, chars
        return values, chars

    return size(data)


def _text(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(str(path), "", f"cannot read: {e}") from None
    return text


def _parse(path: Path, text: str) -> Any:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    yaml = YAML(typ="safe", pure=True)
    yaml.Constructor = _values()
    try:
        data = yaml.load(text)
    except YAMLError as e:
        raise _refusal(path, e) from None
    except RecursionError:
        raise SpecError(str(path), "", f"nested too deeply (over {sys.getrecursionlimit() // 4} levels)") from None
    try:
        values, chars = expanded_size(data)
    except ValueError as e:
        raise SpecError(str(path), "", f"{e}; write the values out instead") from None
    if values > MAX_VALUES:
        raise SpecError(str(path), "", f"expands to over {MAX_VALUES} values through YAML aliases; "
                                       "write the values out instead")
    if chars > MAX_BYTES:
        raise SpecError(str(path), "", f"expands to over {MAX_BYTES >> 20} MiB of text through YAML aliases, more "
                                       "than a sparkctl file may hold; write the values out instead")
    return data


def _refusal(path: Path, error: Exception) -> SpecError:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return SpecError(str(path), "", f"invalid YAML: {problem}", line=mark.line + 1 if mark else None)


@functools.cache
def _guarded(constructor: type) -> type:
    """`constructor` whose failures to build a value are YAML errors at that value's line: a
    constructor raises what Python raises (ValueError for a month 13 or 5,000 digits, KeyError for
    `!!bool abc`), which would escape a caller that isolates a bad file by its YAML errors."""
    from ruamel.yaml.constructor import ConstructorError
    from ruamel.yaml.error import YAMLError

    class Guarded(constructor):  # type: ignore[misc, valid-type]
        def construct_non_recursive_object(self, node: Any, tag: str | None = None) -> Any:
            try:
                return super().construct_non_recursive_object(node, tag)
            except (YAMLError, RecursionError):
                raise
            except Exception as e:  # noqa: BLE001 - whatever a constructor raises is this value's error
                why = "" if isinstance(e, KeyError) else f" ({e})"
                raise ConstructorError(None, None, f"cannot read {_shown(node)} as {_tag(tag or node.tag)}{why}; "
                                                   "quote it if it is text", node.start_mark) from None

    return Guarded


@functools.cache
def _values() -> type:
    """The constructor `read` parses with: only the values a sparkctl file holds (above)."""
    from ruamel.yaml.constructor import ConstructorError, SafeConstructor

    class Values(_guarded(SafeConstructor)):  # type: ignore[misc]
        yaml_constructors: dict = {}  # noqa: RUF012 - ruamel's registry, filled below

        def construct_yaml_int(self, node: Any) -> int:
            value = super().construct_yaml_int(self._short(node))
            if abs(value) >= _DECIMAL_BOUND:  # 0x with 4,000 digits: fine to read, not to write in decimal
                raise ConstructorError(None, None, f"{_shown(node)}: an integer of over {MAX_DIGITS:,} digits; no "
                                                   "sparkctl setting takes one (quote it if it is text)",
                                       node.start_mark)
            return value

        def construct_yaml_float(self, node: Any) -> float:
            return super().construct_yaml_float(self._short(node))

        def construct_undefined(self, node: Any) -> Any:
            raise ConstructorError(None, None, f"the tag {_tag(node.tag)}: a sparkctl file holds mappings, lists, "
                                               "text, numbers, booleans and null; drop the tag", node.start_mark)

        def _short(self, node: Any) -> Any:
            if len(node.value) > MAX_DIGITS:
                raise ConstructorError(None, None, f"{_shown(node)}: a number of {len(node.value):,} characters, "
                                                   f"over the {MAX_DIGITS:,} sparkctl reads (quote it if it is "
                                                   "text)", node.start_mark)
            return node

    for tag, build in (("null", Values.construct_yaml_null), ("bool", Values.construct_yaml_bool),
                       ("int", Values.construct_yaml_int), ("float", Values.construct_yaml_float),
                       ("str", Values.construct_yaml_str), ("timestamp", Values.construct_yaml_str),
                       ("seq", Values.construct_yaml_seq), ("map", Values.construct_yaml_map)):
        Values.add_constructor(f"tag:yaml.org,2002:{tag}", build)
    Values.add_constructor(None, Values.construct_undefined)
    return Values


def _tag(tag: str) -> str:
    """A tag as a file writes it: `!!int` for YAML's own."""
    return tag.replace("tag:yaml.org,2002:", "!!")


def _shown(node: Any) -> str:
    """A value as the file writes it, cut short."""
    value = node.value if isinstance(node.value, str) else f"a {node.id}"
    return repr(value if len(value) <= 24 else value[:24] + "…")
