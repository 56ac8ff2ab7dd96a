"""The catalog as `sparkctl stacks list` shows it: a plain row per deployable stack, with what the
image policy says of its image, then a row per file left out with its error (`invalid`). Made
in-process, or by the daemon (`GET /v1/stacks`), which holds the catalog and the policy already
read, so the command need not import them."""

from __future__ import annotations

from sparkctl.answers import StackRow
from sparkctl.errors import ImageRefused
from sparkctl.policy.images import ImagePolicy, check
from sparkctl.spec.engine import Weights
from sparkctl.spec.load import Catalog


def rows(catalog: Catalog, policy: ImagePolicy) -> tuple[StackRow, ...]:
    deployable = tuple(StackRow(s.name, str(s.kind), s.image.ref, _weights(s.model), _weights(s.draft),
                                s.resources.gpu_memory_utilization, s.port,
                                *_verdict(policy, s.image.ref, s.image.allow_latest)) for s in catalog.deployable())
    return deployable + tuple(StackRow(i.name, i.kind, "-", "-", "-", None, None, False, "-", i.brief)
                              for i in catalog.invalid)


def _verdict(policy: ImagePolicy, ref: str, allow_latest: bool) -> tuple[bool, str]:
    """Whether the policy refuses the image, and its verdict (or why it refuses)."""
    try:
        check(policy, ref, allow_latest=allow_latest)
    except ImageRefused as e:
        return True, str(e).split(":")[0]
    pin = policy.pin_for(ref)
    if pin is None:
        return False, "ok"
    return False, f"pinned {pin.digest[7:19]}" if pin.digest else "known-good tag, digest at first up"


def _weights(weights: Weights | None) -> str:
    if weights is None:
        return "-"
    return weights.path or f"{weights.repo}@{weights.revision}"
