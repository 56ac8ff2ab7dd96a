"""Read the image policy's files: the `images.yaml` sparkctl ships (in its stacks dir) and the
owner's (in the config dir). Both are read only: sparkctl never writes either; what it records
(pins, bans, wakes, the owner's `image` commands) is state (`state/images.py`), laid over them
(`policy/images.layered`). The state store calls this; the decisions live in `policy/images.py`.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from sparkctl.errors import SpecError
from sparkctl.policy.images import ImagePolicy, Layer
from sparkctl.spec import kept, yamlfile


@dataclass(frozen=True)
class PolicyFiles:
    """The policy's read-only layers: the shipped file, then the owner's (None: no such layer)."""

    shipped: Path | None = None
    owner: Path | None = None

    def layers(self) -> list[tuple[Layer, ImagePolicy]]:
        return [(layer, policy_in(path)) for layer, path in ((Layer.SHIPPED, self.shipped), (Layer.OWNER, self.owner))
                if path is not None]


def policy_in(path: Path) -> ImagePolicy:
    """The policy in `path`, read again only when the file changed (`spec.kept`)."""
    try:
        key = kept.signature(path)
    except OSError:  # replaced while we looked
        return load_policy(path)
    return kept.cached(f"policy {path}", key, lambda: load_policy(path))


def load_policy(path: Path) -> ImagePolicy:
    """The policy in `path`; an absent file is an empty policy."""
    if not path.exists():
        return ImagePolicy()
    return parse_policy(yamlfile.read(path), str(path))


def parse_policy(data: object, where: str) -> ImagePolicy:
    try:
        return ImagePolicy.model_validate(data or {})
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise SpecError(where, key, f"{first['msg']} (allowed top-level keys: pins, blacklist, wakes)") from None


def committed(path: Path) -> ImagePolicy | None:
    """The policy in `path` as the git commit checked out around it holds it: what a checkout of
    sparkctl ships there, before anyone edited the file. None outside a git work tree (an
    installed package, an owner's own folder) or when git cannot say."""
    try:
        shown = subprocess.run(["git", "-C", str(path.parent), "show", f"HEAD:./{path.name}"],  # noqa: S603,S607
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if shown.returncode != 0:
        return None
    return parse_policy(yamlfile.parse(path, shown.stdout), f"{path} (as committed)")
