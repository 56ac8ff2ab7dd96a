"""A patch set: what must change inside an engine image before a stack runs on it.

Whole-file overlays from a model or draft snapshot, class-attribute shims and unified diffs,
each confined to its folder. `load.py` reads them from `patches/*.yaml`; `deploy/patches.py`
applies them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field, field_validator

from sparkctl.spec.base import Name, RelativePath, Spec, inside

if TYPE_CHECKING:
    from sparkctl.spec.models import Stack


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
    # Why prefix caching is unsupported; a stack whose engine would run it (`VllmArgs.prefix_caching`:
    # vLLM turns it on when no flag says otherwise) then needs `allow: [prefix-caching]`.
    prefix_caching: str | None = None
    source: str  # where the limits are stated (a seed's line)


class PatchSet(Spec):
    name: Name
    description: str = ""
    overlays: tuple[Overlay, ...] = ()
    shims: tuple[Shim, ...] = ()
    diffs: tuple[RelativePath, ...] = ()  # unified diff files, relative to the patches dir
    limits: Limits | None = None

    def breach(self, stack: Stack) -> tuple[list[str], str] | None:
        """Where a stack using this patch set goes past the limits of its draft, and why: (the
        key's path, the problem); None when it keeps to them."""
        limits, v = self.limits, stack.vllm
        if limits is None or v is None:
            return None
        tokens = v.speculative.num_speculative_tokens if v.speculative else None
        if limits.max_speculative_tokens is not None and tokens is not None and tokens > limits.max_speculative_tokens:
            return (["vllm", "speculative", "num_speculative_tokens"],
                    f"{tokens} is more than the {limits.max_speculative_tokens} the draft of patch set {self.name!r} "
                    f"supports ({limits.source})")
        if limits.prefix_caching and v.prefix_caching and "prefix-caching" not in stack.allow:
            unset = " (vLLM turns it on when no flag is given)" if v.enable_prefix_caching is None else ""
            return (["vllm", "enable_prefix_caching"],
                    f"prefix caching would be on{unset}, but {limits.prefix_caching} ({limits.source}): set "
                    "`enable_prefix_caching: false`, or add `allow: [prefix-caching]` to the stack if you mean it")
        return None
