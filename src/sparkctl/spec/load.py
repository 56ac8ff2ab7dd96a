"""Load stack and patch-set files into validated, frozen models.

A stack file holds one mapping with a `name`; `extends: other` deep-merges it over another
stack (mappings merge key by key, anything else is replaced, `null` clears). Every problem
becomes a `SpecError` naming the file, the dotted key and what is allowed. Called by the CLI
and the deploy pipeline through `load_catalog`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sparkctl.errors import NoSuchStack, SpecError
from sparkctl.settings import Settings
from sparkctl.spec import kept, yamlfile
from sparkctl.spec.models import Stack
from sparkctl.spec.patchset import PatchSet

POLICY_FILE = "images.yaml"
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Catalog:
    """Every stack and patch set found, with the file each came from."""

    stacks: dict[str, Stack] = field(default_factory=dict)
    patch_sets: dict[str, PatchSet] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)

    def stack(self, name: str) -> Stack:
        found = self.stacks.get(name)
        if found is None or found.abstract:
            known = ", ".join(n for n, s in sorted(self.stacks.items()) if not s.abstract)
            raise NoSuchStack(name, "", f"no such stack; known stacks: {known or 'none'}")
        return found

    def deployable(self) -> list[Stack]:
        return [s for _, s in sorted(self.stacks.items()) if not s.abstract]


def load_catalog(stacks_dir: Path, patches_dir: Path | None = None, *, port_offset: int = 0) -> Catalog:
    """Load every `*.yaml` stack under `stacks_dir` and patch set under `patches_dir`; every
    engine port is shifted by `port_offset` (an instance beside another's live stacks)."""
    patch_sets = load_patch_sets(patches_dir) if patches_dir and patches_dir.is_dir() else {}
    files = sorted(p for p in stacks_dir.glob("*.yaml") if p.name != POLICY_FILE)
    return load_stacks(files, patch_sets=patch_sets, port_offset=port_offset)


def catalog_for(settings: Settings) -> Catalog:
    """The stacks and patch sets as this instance sees them (ports shifted by its offset), read
    again only when a file in either folder changed: an edit applies at the next call, and a
    daemon's passes or a CLI call do not parse every file each time (`spec.kept`)."""
    def read() -> Catalog:
        return load_catalog(settings.stacks_dir, settings.patches_dir, port_offset=settings.port_offset)

    try:
        key = (settings.port_offset, kept.signature(settings.stacks_dir, settings.patches_dir))
    except OSError:  # a file went away while we looked: read what is there now
        return read()
    return kept.cached(settings.state_dir / "cache" / "catalog.pickle", key, read, Catalog)


def load_stacks(files: Iterable[Path], *, patch_sets: Mapping[str, PatchSet] = {}, port_offset: int = 0) -> Catalog:
    raw, origin = _read_named(files, kind="stack")
    stacks = {name: _build(name, raw, origin, patch_sets, port_offset) for name in raw}
    return Catalog(stacks=stacks, patch_sets=dict(patch_sets), files=origin)


def load_patch_sets(patches_dir: Path) -> dict[str, PatchSet]:
    raw, origin = _read_named(sorted(patches_dir.glob("*.yaml")), kind="patch set")
    return {name: _validate(PatchSet, data, origin[name]) for name, data in raw.items()}


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; syntax errors name the file and the line."""
    return yamlfile.read(path)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`: mappings merge recursively, other values replace."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_named(files: Iterable[Path], *, kind: str) -> tuple[dict[str, dict], dict[str, Path]]:
    raw: dict[str, dict] = {}
    origin: dict[str, Path] = {}
    for path in files:
        data = read_yaml(path)
        if not isinstance(data, dict):
            raise SpecError(str(path), "", f"a {kind} file holds one mapping with a `name`")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise SpecError(str(path), "name", "required: a lowercase name like `qwen36-dflash`")
        if name in origin:
            raise SpecError(str(path), "name", f"{kind} {name!r} is already defined in {origin[name]}")
        raw[name], origin[name] = data, path
    return raw, origin


def _build(
    name: str, raw: dict[str, dict], origin: dict[str, Path], patch_sets: Mapping[str, PatchSet], port_offset: int
) -> Stack:
    data = _shifted(_resolve_extends(name, raw, origin, chain=()), port_offset)
    stack = _validate(Stack, data, origin[name])
    unknown = [p for p in stack.patches if p not in patch_sets]
    if unknown:
        allowed = ", ".join(sorted(patch_sets)) or "none defined"
        raise SpecError(str(origin[name]), "patches", f"unknown patch set {unknown[0]!r}; known: {allowed}")
    return stack


def _resolve_extends(
    name: str, raw: dict[str, dict], origin: dict[str, Path], chain: tuple[str, ...]
) -> dict[str, Any]:
    data = raw[name]
    base_name = data.get("extends")
    if base_name is None:
        return dict(data)
    where = str(origin[chain[0] if chain else name])
    if base_name in chain or base_name == name:
        cycle = " -> ".join((*chain, name, base_name))
        raise SpecError(where, "extends", f"cycle: {cycle}")
    if not isinstance(base_name, str) or base_name not in raw:
        known = ", ".join(sorted(raw))
        raise SpecError(where, "extends", f"no stack named {base_name!r}; known: {known}")
    base = _resolve_extends(base_name, raw, origin, (*chain, name))
    base.pop("abstract", None)
    return deep_merge(base, data)


def _shifted(data: dict[str, Any], offset: int) -> dict[str, Any]:
    """The stack with its engine port moved by `offset` (SPARKCTL_PORT_OFFSET)."""
    for section in ("vllm", "compose"):
        body = data.get(section)
        if offset and isinstance(body, dict) and isinstance(body.get("port"), int):
            data = {**data, section: {**body, "port": body["port"] + offset}}
    return data


def _validate(model: type[M], data: dict, path: Path) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _spec_error(model, e, path) from None


def _spec_error(model: type[BaseModel], error: ValidationError, path: Path) -> SpecError:
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    key = ".".join(loc) or "(top level)"
    if first["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        problem = f"unknown key; allowed here: {', '.join(allowed)}"
    else:
        got = first.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        problem = first["msg"].removeprefix("Value error, ") + shown
    more = len(error.errors()) - 1
    return SpecError(str(path), key, problem + (f" (and {more} more problems)" if more else ""))


def _allowed_keys(model: type[BaseModel], loc: list[str]) -> list[str]:
    """The field names accepted at `loc` inside `model` (following nested models)."""
    current: Any = model
    for part in loc:
        if part.isdigit():  # an index into a list of models
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            break
        info = current.model_fields.get(part)
        current = _model_in(info.annotation) if info else None
    if not (isinstance(current, type) and issubclass(current, BaseModel)):
        return []
    return sorted(info.alias or name for name, info in current.model_fields.items())


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside `X | None` or `tuple[X, ...]`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
