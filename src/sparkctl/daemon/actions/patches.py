"""`sparkctl patch check` in the daemon: a stack's image, weights and draft fetched and its patch
sets applied to the image's files, in the stack's turn, starting nothing; the diff is the
result. Its fetch streams like an `up`'s, and a cancel, a `down` or the daemon's stop end it the
same way (its `stop` is among the machine's `fetching`)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sparkctl.daemon.turns import Turns
from sparkctl.deploy.pipeline import Deployer
from sparkctl.messages import PatchChecked
from sparkctl.spec.models import Kind


class PatchChecks:
    def __init__(self, *, deployer: Callable[[], Deployer], turns: Turns, fetching: dict[str, threading.Event]
                 ) -> None:
        self.deployer, self.turns, self.fetching = deployer, turns, fetching

    def check(self, stack: str, *, ticket: int | None = None, stop: threading.Event | None = None) -> PatchChecked:
        with self.turns.turn(stack, ticket):
            deployer = self.deployer()
            spec = deployer.catalog.stack(stack)
            if spec.kind is Kind.COMPOSE or not spec.patches:
                return PatchChecked(spec.name)
            self.fetching[stack] = stop = stop or threading.Event()
            try:
                prepared = deployer.prepare(spec, stop=stop)
            finally:
                self.fetching.pop(stack, None)
            prepared.image.settle()
        patched = prepared.patches
        return PatchChecked(spec.name, len(patched.mounts), patched.hash, patched.vllm_dir, patched.diff)
