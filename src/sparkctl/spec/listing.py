"""The catalog as `sparkctl stacks list` shows it: a plain row per deployable stack, with what the
image policy says of its image, then a row per file left out with its error (`invalid`). Made
in-process, or by the daemon (`GET /v1/stacks`), which holds the catalog and the policy already
read, so the command need not import them."""

from __future__ import annotations

from typing import Any

from sparkctl.errors import ImageRefused
from sparkctl.policy.images import ImagePolicy, check
from sparkctl.spec.engine import Weights
from sparkctl.spec.load import Catalog


def rows(catalog: Catalog, policy: ImagePolicy) -> list[dict[str, Any]]:
    return [{"stack": s.name, "kind": str(s.kind), "image": s.image.ref, "model": _weights(s.model),
             "draft": _weights(s.draft), "memory": s.resources.gpu_memory_utilization, "port": s.port,
             "invalid": None, **_verdict(policy, s.image.ref, s.image.allow_latest)} for s in catalog.deployable()
            ] + [{"stack": i.name, "kind": i.kind, "image": "-", "model": "-", "draft": "-", "memory": None,
                  "port": None, "invalid": i.brief, "refused": False, "policy": "-"} for i in catalog.invalid]


def _verdict(policy: ImagePolicy, ref: str, allow_latest: bool) -> dict[str, Any]:
    try:
        check(policy, ref, allow_latest=allow_latest)
    except ImageRefused as e:
        return {"refused": True, "policy": str(e).split(":")[0]}
    pin = policy.pin_for(ref)
    if pin is None:
        verdict = "ok"
    else:
        verdict = f"pinned {pin.digest[7:19]}" if pin.digest else "known-good tag, digest at first up"
    return {"refused": False, "policy": verdict}


def _weights(weights: Weights | None) -> str:
    if weights is None:
        return "-"
    return weights.path or f"{weights.repo}@{weights.revision}"
