"""The class-attribute shim: insert class-level defaults into a class of a Python source file.

The DFlash shim gives `DFlashProposer` `_draft_kv_cache_group_ids = ()` and
`_draft_layer_to_kv_cache_gid = {}`. The class is found through the syntax tree, never by line
number; attributes already assigned at class level are left alone (so re-applying is a no-op);
every other byte of the file stays as it was; the result is parsed again before it is used.
Pure; called by `deploy/patches.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from sparkctl.errors import SparkctlError


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
