"""What every spec model shares: a frozen base that forbids unknown keys, and the constrained
field types of stack and patch-set files.

The base is why a typo in a stack file fails loudly with the key and the allowed names; the
types are why a port, a name or a path is refused when the file is loaded, not when it is used.
`models.py`, `engine.py` and `patchset.py` build on them.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def inside(value: str) -> str:
    """A path that stays inside the folder it is relative to: not absolute, no `..` part."""
    parts = value.split("/")
    if value.startswith("/") or ".." in parts or "" in parts[:-1] or "\\" in value:
        raise ValueError(f"{value!r} must be a relative path inside its folder (no leading /, no ..)")
    return value


RelativePath = Annotated[str, Field(min_length=1), AfterValidator(inside)]
# A branch, tag or `refs/...` name, or a commit hash: what the Hub accepts as a revision.
Revision = Annotated[str, Field(max_length=255, pattern=r"^[A-Za-z0-9_][\w.+/-]*$"), AfterValidator(inside)]
Name = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
Port = Annotated[int, Field(ge=1, le=65535)]
Seconds = Annotated[float, Field(gt=0, le=86_400)]
Fraction = Annotated[float, Field(gt=0, le=1)]
SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)


class Spec(BaseModel):
    # Validators are built when first used, not at import: a catalog unpickled from the state dir's
    # cache never needs them (`spec.load.catalog_for`).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)
