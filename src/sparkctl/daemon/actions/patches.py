"""`sparkctl patch check` in the daemon: a stack's image, weights and draft fetched and its patch
sets applied to the image's files, in the stack's turn, starting nothing; the diff is the
result. Its fetch streams like an `up`'s, and a cancel, a `down` or the daemon's stop end it the
same way (its `stop` is among the `Fetches`). A coroutine on the loop; the fetch on a worker."""

from __future__ import annotations

import threading
from collections.abc import Callable

from sparkctl.daemon.fetches import Fetches
from sparkctl.daemon.seam import blocking
from sparkctl.daemon.turns import Turns
from sparkctl.deploy.pipeline import Deployer
from sparkctl.messages import PatchChecked
from sparkctl.spec.models import Kind


class PatchChecks:
    def __init__(self, *, deployer: Callable[[], Deployer], turns: Turns, fetches: Fetches) -> None:
        self.deployer, self.turns, self.fetches = deployer, turns, fetches

    async def check(self, stack: str, *, ticket: int | None = None, stop: threading.Event | None = None
                    ) -> PatchChecked:
        async with self.turns.turn(stack, ticket):
            return await blocking(self._check, stack, stop)

    def _check(self, stack: str, stop: threading.Event | None) -> PatchChecked:
        deployer = self.deployer()
        spec = deployer.catalog.stack(stack)
        if spec.kind is Kind.COMPOSE or not spec.patches:
            return PatchChecked(spec.name)
        with self.fetches.running(stack, stop) as stop:
            prepared = deployer.prepare(spec, stop=stop)
        prepared.image.settle()
        patched = prepared.patches
        return PatchChecked(spec.name, len(patched.mounts), patched.hash, patched.vllm_dir, patched.diff)
