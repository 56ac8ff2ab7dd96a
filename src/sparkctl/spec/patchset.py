"""A patch set: what must change inside an engine image before a stack runs on it.

Whole-file overlays from a model or draft snapshot, class-attribute shims and unified diffs,
each confined to its folder. `load.py` reads them from `patches/*.yaml`; `deploy/patches.py`
applies them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from sparkctl.spec.base import Name, RelativePath, Spec, inside


class Overlay(Spec):
    """A whole file from the draft snapshot, laid over a path in vLLM's package dir."""

    source: str = Field(pattern=r"^(draft|model):.+")
    target: Annotated[RelativePath, Field(pattern=r"^[\w./-]+\.py$")]

    @field_validator("source")
    @classmethod
    def _source_inside(cls, value: str) -> str:
        inside(value.partition(":")[2])
        return value


class Shim(Spec):
    """Class-level attribute defaults inserted into a class of a vLLM source file."""

    file: Annotated[RelativePath, Field(pattern=r"^[\w./-]+\.py$")]
    class_name: str = Field(alias="class", pattern=r"^[A-Za-z_]\w*$")
    attributes: dict[str, str] = Field(min_length=1)


class Limits(Spec):
    """What the draft a patch set serves supports, with where that is said: a stack using the
    patch set is held to it when the catalog loads."""

    max_speculative_tokens: int | None = Field(default=None, ge=1)
    # Why prefix caching is unsupported; a stack turning it on then needs `allow: [prefix-caching]`.
    prefix_caching: str | None = None
    source: str  # where the limits are stated (a seed's line)


class PatchSet(Spec):
    name: Name
    description: str = ""
    overlays: tuple[Overlay, ...] = ()
    shims: tuple[Shim, ...] = ()
    diffs: tuple[RelativePath, ...] = ()  # unified diff files, relative to the patches dir
    limits: Limits | None = None
