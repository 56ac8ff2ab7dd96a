"""What the daemon does when asked to change something (the API's `Commands`): deploys (`up`,
`down`), parking (`park`, `wake`, idle parks, wakes on demand), aliases (`switch`, `route`) and
trials (`retest`, comparison reports); and what the CLI once did itself: benchmarks
(`bench.py`), patch checks (`patches.py`) and the image policy's edits (`images.py`); on a
fleet's head, the fleet's `up`, `down` and `ps` (`machines.Fleet`). Each is built with its own
collaborators (`daemon/app.py`). Coroutines on the daemon's loop, their blocking work on workers
through the seam; each action on a stack runs in its turn (`daemon/turns.py`), marked busy so
reconcile passes leave it alone. Results are returned as values; the store only records them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkctl.daemon.actions.bench import Benchmarks
from sparkctl.daemon.actions.deploys import Deploys
from sparkctl.daemon.actions.images import ImageBook
from sparkctl.daemon.actions.parking import Parking
from sparkctl.daemon.actions.patches import PatchChecks
from sparkctl.daemon.actions.switch import Aliases
from sparkctl.daemon.actions.trials import Trials
from sparkctl.daemon.events import EventBus
from sparkctl.daemon.turns import Turns

if TYPE_CHECKING:
    from sparkctl.daemon.actions.machines import Fleet


@dataclass(frozen=True, kw_only=True)
class Actions:
    bus: EventBus
    turns: Turns
    deploys: Deploys
    parking: Parking
    aliases: Aliases
    trials: Trials
    bench: Benchmarks
    patches: PatchChecks
    images: ImageBook
    fleet: Fleet | None  # the fleet this daemon heads (`fleet up`, `down`, `ps`), or None
