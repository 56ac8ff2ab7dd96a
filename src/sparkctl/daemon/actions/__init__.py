"""What the daemon does when asked to change something (the API's `Commands`): deploys (`up`,
`down`), parking (`park`, `wake`, idle parks, wakes on demand), aliases (`switch`, `route`) and
trials (`retest`, comparison reports); and what the CLI once did itself: benchmarks
(`bench.py`), patch checks (`patches.py`) and the image policy's edits (`images.py`), each
built with its own collaborators. The handlers call these on a worker thread; each action
on a stack runs in its turn (`daemon/turns.py`), marked busy so reconcile passes leave it
alone. Results are returned as values; the store only records them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkctl.daemon.actions.aliases import Aliases
from sparkctl.daemon.actions.bench import Benchmarks
from sparkctl.daemon.actions.context import Context
from sparkctl.daemon.actions.deploys import Deploys
from sparkctl.daemon.actions.images import ImageBook
from sparkctl.daemon.actions.machines import Machines, Spark
from sparkctl.daemon.actions.parking import Parking
from sparkctl.daemon.actions.patches import PatchChecks
from sparkctl.daemon.actions.trials import Trials
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.turns import Turns

if TYPE_CHECKING:
    from sparkctl.fleet.machine import FleetMachine


@dataclass(frozen=True)
class Actions:
    ctx: Context
    deploys: Deploys
    parking: Parking
    aliases: Aliases
    trials: Trials
    bench: Benchmarks
    patches: PatchChecks
    images: ImageBook

    @classmethod
    def over(cls, ctx: Context, *, bench: Benchmarks, patches: PatchChecks, images: ImageBook) -> Actions:
        parking = Parking(ctx)
        deploys = Deploys(ctx, parking)
        aliases = Aliases(ctx, deploys, parking)
        ctx.machines = Machines(Spark(parking, aliases), ctx.fleet)
        return cls(ctx, deploys, parking, aliases, Trials(ctx), bench, patches, images)

    @property
    def bus(self) -> EventBus:
        return self.ctx.bus

    @property
    def fleet(self) -> FleetMachine | None:
        """The fleet this daemon heads (`fleet up`, `down`, `ps`), or None."""
        return self.ctx.fleet

    @property
    def turns(self) -> Turns:
        return self.ctx.turns
