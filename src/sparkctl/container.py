"""A sparkctl engine container as Docker reports it, typed, and the labels that make it one.

The Docker adapter turns each listing into a `Container`; the pipeline, status, the reconciler
and the daemon read these fields instead of Docker's dicts. Plain model, imported by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkctl import instance as instances

LABEL_STACK = "sparkctl.stack"
LABEL_SPEC_HASH = "sparkctl.spec-hash"
LABEL_FINGERPRINT = "sparkctl.fingerprint"
LABEL_MEMORY = "sparkctl.gpu-memory"  # the fraction reserved, for admission without the stack file
# On a container a fleet host's agent deployed (`sparkctl fleet up`): the fleet owns it, so the
# daemon on the same host neither removes it as undesired nor routes it as a local stack.
LABEL_PLACED = "sparkctl.placed"
LABEL_RANK = "sparkctl.rank"  # a multi-node stack's rank (0 serves HTTP)
LABEL_RELAY = "sparkctl.relay"  # a placed engine's port, which its host's agent relays (gateway/relay.py)


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    stack: str
    instance: str
    labelled: bool  # carries an instance label (containers from before instances do not)
    state: str  # Docker's: created, running, exited, ...
    created: float  # epoch seconds
    fingerprint: str | None
    spec_hash: str | None
    memory: float | None  # the unified-memory share it reserved
    placed: bool = False  # deployed by the fleet's agent (LABEL_PLACED), not by this host's daemon
    relay: int | None = None  # the port its host's agent relays (LABEL_RELAY): a placed engine that serves HTTP

    @property
    def running(self) -> bool:
        return self.state == "running"

    @classmethod
    def from_listing(cls, raw: dict[str, Any]) -> Container:
        """From one entry of Docker's container list (`GET /containers/json`)."""
        labels = raw.get("Labels") or {}
        memory = labels.get(LABEL_MEMORY)
        return cls(id=raw["Id"], name=(raw.get("Names") or ["/"])[0].lstrip("/"), stack=labels[LABEL_STACK],
                   instance=labels.get(instances.LABEL, instances.DEFAULT), labelled=instances.LABEL in labels,
                   state=raw.get("State", ""), created=float(raw.get("Created", 0)),
                   fingerprint=labels.get(LABEL_FINGERPRINT), spec_hash=labels.get(LABEL_SPEC_HASH),
                   memory=float(memory) if memory else None, placed=LABEL_PLACED in labels,
                   relay=int(labels[LABEL_RELAY]) if labels.get(LABEL_RELAY, "").isdigit() else None)
