"""Load stack and patch-set files into validated, frozen models.

A stack file holds one mapping with a `name`; `extends: other` deep-merges it over another
stack (mappings merge key by key, anything else is replaced, `null` clears). The stacks come in
two layers: the shipped ones (read only), then the owner's (the config dir's `stacks/`): an
owner's stack named like a shipped one replaces it, or with `extends: <its own name>` is merged
over it; any stack may extend one of either layer. Every problem is a
`SpecError` naming the file, the line, the dotted key and what is allowed. A file with a problem
is left out of the catalog and listed in `Catalog.invalid`, as is a stack built on it
(`extends`, `patches`): the others load, and only asking for that one fails. Called by the CLI
and the daemon through `catalog_for`; the composition root reports the files left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from sparkctl.errors import NoSuchStack, SpecError
from sparkctl.policy.images import Layer
from sparkctl.settings import Settings
from sparkctl.spec import kept, yamlfile
from sparkctl.spec.models import Stack
from sparkctl.spec.patchset import PatchSet

POLICY_FILE = "images.yaml"
M = TypeVar("M", bound=BaseModel)
Kind = Literal["stack", "patch set"]


@dataclass(frozen=True)
class Invalid:
    """A file left out of the catalog, with its error. `name` is the stack or patch set it
    defines (its file name's stem when it cannot be read). A stack left out only because a file
    it is built on is has that file as `cause`; that file lists it in `dependents`."""

    file: Path
    kind: Kind
    name: str
    key: str
    problem: str
    line: int | None = None
    cause: Path | None = None
    dependents: tuple[str, ...] = ()

    @classmethod
    def of(cls, error: SpecError, *, file: Path, kind: Kind, name: str) -> Invalid:
        cause = (error.cause.cause or error.cause.file) if isinstance(error, BuiltOnInvalid) else None
        return cls(file, kind, name, error.key, error.problem, error.line, cause)

    @property
    def error(self) -> SpecError:
        return SpecError(str(self.file), self.key, self.problem, line=self.line)

    @property
    def brief(self) -> str:
        """The error with the file's name only, for a table's cell."""
        return str(SpecError(self.file.name, self.key, self.problem, line=self.line))


class BuiltOnInvalid(SpecError):
    """A stack whose base or patch set is left out: its error names that file's."""

    def __init__(self, file: Path, key: str, what: str, cause: Invalid) -> None:
        super().__init__(str(file), key, f"{what} is left out: {cause.error}", line=yamlfile.line_of(file, [key]))
        self.cause = cause


@dataclass(frozen=True)
class Catalog:
    """Every stack and patch set found, with the file each came from, and the files left out;
    `owner_files`: the owner's layer's files, `overridden`: the owner's stacks named like a shipped one."""

    stacks: dict[str, Stack] = field(default_factory=dict)
    patch_sets: dict[str, PatchSet] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    invalid: tuple[Invalid, ...] = ()
    owner_files: frozenset[Path] = frozenset()
    overridden: frozenset[str] = frozenset()

    def source(self, name: str, file: Path | None = None) -> str:
        """Where the stack `name` (from `file`, by default the one it was read from) comes from, as
        `stacks list` shows it: shipped, owner, or owner over shipped."""
        if (file or self.files.get(name)) not in self.owner_files:
            return str(Layer.SHIPPED)
        return f"{Layer.OWNER}, over {Layer.SHIPPED}" if name in self.overridden else str(Layer.OWNER)

    def stack(self, name: str) -> Stack:
        found = self.stacks.get(name)
        left_out = _named(self.invalid, "stack", name)
        if found is None and left_out is not None:
            raise left_out.error
        if found is None or found.abstract:
            known = ", ".join(n for n, s in sorted(self.stacks.items()) if not s.abstract)
            invalid = ", ".join(sorted({i.file.name for i in self.invalid}))
            raise NoSuchStack(name, "", f"no such stack; known stacks: {known or 'none'}"
                                        + (f"; left out, invalid: {invalid}" if invalid else ""))
        return found

    def deployable(self) -> list[Stack]:
        return [s for _, s in sorted(self.stacks.items()) if not s.abstract]


def load_catalog(stacks_dir: Path, patches_dir: Path | None = None, *, owner_dir: Path | None = None,
                 port_offset: int = 0) -> Catalog:
    """Load every `*.yaml` stack under `stacks_dir`, then the owner's under `owner_dir` over them,
    and every patch set under `patches_dir`; every engine port is shifted by `port_offset` (an
    instance beside another's live stacks)."""
    patch_files = sorted(patches_dir.glob("*.yaml")) if patches_dir and patches_dir.is_dir() else []
    return load_stacks(stack_files(stacks_dir), owner=stack_files(owner_dir), patch_files=patch_files,
                       port_offset=port_offset)


def stack_files(folder: Path | None) -> list[Path]:
    """The stack files in `folder` (none when it is None or absent), in order."""
    return sorted(p for p in folder.glob("*.yaml") if p.name != POLICY_FILE) if folder and folder.is_dir() else []


def catalog_for(settings: Settings) -> Catalog:
    """The stacks and patch sets as this instance sees them (ports shifted by its offset), read
    again only when a file in any of the folders changed: an edit applies at the next call, and a
    daemon's passes do not parse every file each time (`spec.kept`)."""
    owner = settings.owner_stacks_dir

    def read() -> Catalog:
        return load_catalog(settings.stacks_dir, settings.patches_dir, owner_dir=owner,
                            port_offset=settings.port_offset)

    try:
        key = (settings.stacks_dir, settings.patches_dir, owner, settings.port_offset,
               kept.signature(settings.stacks_dir, settings.patches_dir, owner))
    except OSError:  # a file went away while we looked: read what is there now
        return read()
    return kept.cached("catalog", key, read)


def load_stacks(files: Iterable[Path], *, owner: Iterable[Path] = (), patch_files: Iterable[Path] = (),
                port_offset: int = 0) -> Catalog:
    """The stacks in `files`, those in `owner` laid over them, and the patch sets in
    `patch_files`. Bases are built before the stacks that extend them, so a stack on a base left
    out is left out, naming it."""
    patch_sets, invalid = _load_patch_sets(patch_files)
    owner = list(owner)
    raw, origin, unread = _read_named(files, kind="stack")
    mine, mine_origin, unread_owner = _read_named(owner, kind="stack")
    invalid += unread + unread_owner
    overridden = frozenset(raw.keys() & mine.keys())
    for name, data in mine.items():
        if data.get("extends") == name and name in raw:  # over the shipped stack of its name
            data = deep_merge(raw[name], {k: v for k, v in data.items() if k != "extends"})
        raw[name], origin[name] = data, mine_origin[name]
    stacks = {}
    for name in sorted(raw, key=lambda n: _depth(n, raw)):
        try:
            stacks[name] = _build(name, raw, origin, patch_sets, port_offset, invalid)
        except SpecError as e:
            invalid.append(Invalid.of(e, file=origin[name], kind="stack", name=name))
    invalid = [replace(i, dependents=tuple(d.name for d in invalid if d.cause == i.file)) for i in invalid]
    return Catalog(stacks=stacks, patch_sets=patch_sets, files=origin, invalid=tuple(invalid),
                   owner_files=frozenset(owner), overridden=overridden)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` over `base`: mappings merge recursively, other values replace."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _load_patch_sets(files: Iterable[Path]) -> tuple[dict[str, PatchSet], list[Invalid]]:
    raw, origin, invalid = _read_named(files, kind="patch set")
    patch_sets = {}
    for name, data in raw.items():
        try:
            patch_sets[name] = _validate(PatchSet, data, origin[name])
        except SpecError as e:
            invalid.append(Invalid.of(e, file=origin[name], kind="patch set", name=name))
    return patch_sets, invalid


def _read_named(files: Iterable[Path], *, kind: Kind) -> tuple[dict[str, dict], dict[str, Path], list[Invalid]]:
    """Each file's mapping by the name it declares, and the files that cannot be read. A name two
    files declare is refused rather than one of them guessed: the later file is reported."""
    raw: dict[str, dict] = {}
    origin: dict[str, Path] = {}
    invalid: list[Invalid] = []
    taken: dict[str, Path] = {}
    for path in files:
        try:
            name, data = _named_mapping(path, kind)
        except SpecError as e:
            invalid.append(Invalid.of(e, file=path, kind=kind, name=path.stem))
            continue
        if name in taken:
            raw.pop(name, None)
            origin.pop(name, None)
            error = _at(path, ["name"], f"{kind} {name!r} is already defined in {taken[name]}")
            invalid.append(Invalid.of(error, file=path, kind=kind, name=name))
            continue
        raw[name], origin[name], taken[name] = data, path, path
    return raw, origin, invalid


def _named_mapping(path: Path, kind: Kind) -> tuple[str, dict]:
    data = yamlfile.read(path)
    if not isinstance(data, dict):
        raise SpecError(str(path), "", f"a {kind} file holds one mapping with a `name`")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise _at(path, ["name"], "required: a lowercase name like `qwen36-dflash`")
    return name, data


def _named(invalid: Iterable[Invalid], kind: Kind, name: str) -> Invalid | None:
    return next((i for i in invalid if i.kind == kind and i.name == name), None)


def _depth(name: str, raw: dict[str, dict]) -> int:
    """How many stacks `name` stands on, itself included (a cycle or a missing base ends it)."""
    seen = {name}
    while isinstance(base := raw[name].get("extends"), str) and base in raw and base not in seen:
        seen.add(name := base)
    return len(seen)


def _build(name: str, raw: dict[str, dict], origin: dict[str, Path], patch_sets: Mapping[str, PatchSet],
           port_offset: int, invalid: list[Invalid]) -> Stack:
    data = _shifted(_resolve_extends(name, raw, origin, (), invalid), port_offset)
    stack = _validate(Stack, data, origin[name])
    unknown = [p for p in stack.patches if p not in patch_sets]
    if unknown:
        left_out = _named(invalid, "patch set", unknown[0])
        if left_out is not None:
            raise BuiltOnInvalid(origin[name], "patches", f"patch set {unknown[0]!r}", left_out)
        allowed = ", ".join(sorted(patch_sets)) or "none defined"
        raise _at(origin[name], ["patches"], f"unknown patch set {unknown[0]!r}; known: {allowed}")
    for patch_set in (patch_sets[p] for p in stack.patches):
        if (breach := patch_set.breach(stack)) is not None:
            raise _at(origin[name], *breach)
    return stack


def _resolve_extends(
    name: str, raw: dict[str, dict], origin: dict[str, Path], chain: tuple[str, ...], invalid: list[Invalid]
) -> dict[str, Any]:
    data = raw[name]
    base_name = data.get("extends")
    if base_name is None:
        return dict(data)
    where = origin[chain[0] if chain else name]
    if base_name in chain or base_name == name:
        cycle = " -> ".join((*chain, name, base_name))
        raise _at(where, ["extends"], f"cycle: {cycle}")
    left_out = _named(invalid, "stack", base_name) if isinstance(base_name, str) else None
    if left_out is not None:
        raise BuiltOnInvalid(where, "extends", f"base stack {base_name!r}", left_out)
    if not isinstance(base_name, str) or base_name not in raw:
        known = ", ".join(sorted(raw))
        raise _at(where, ["extends"], f"no stack named {base_name!r}; known: {known}")
    base = _resolve_extends(base_name, raw, origin, (*chain, name), invalid)
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
    except Exception as e:  # noqa: BLE001 - a check that breaks on this file leaves it out, not the catalog
        raise SpecError(str(path), "", f"could not be checked ({type(e).__name__}: {e}); a sparkctl bug: "
                                       "report it with the file") from None


def _spec_error(model: type[BaseModel], error: ValidationError, path: Path) -> SpecError:
    first = error.errors()[0]
    loc = [str(part) for part in first["loc"]]
    if first["type"] == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        problem = f"unknown key; allowed here: {', '.join(allowed)}"
    else:
        got = first.get("input")
        shown = "" if isinstance(got, (dict, list)) or got is None else f" (got {got!r})"
        problem = first["msg"].removeprefix("Value error, ") + shown
    more = len(error.errors()) - 1
    return _at(path, loc, problem + (f" (and {more} more problems)" if more else ""))


def _at(path: Path, loc: list[str], problem: str) -> SpecError:
    """An error at the key `loc` of `path` (the top level when empty), on its line when known."""
    line = yamlfile.line_of(path, loc) if loc else None
    return SpecError(str(path), ".".join(loc) or "(top level)", problem, line=line)


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
