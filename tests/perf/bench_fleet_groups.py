"""Multi-node group figures: for each health lie, the time from the fault to the group being out of
routing, beside what plain `/health` polling of rank 0 sees in the same run; and the group's
recreate time minus its engine's own start.

Three namespace hosts (tests/fleet), a head daemon on host a, a stack `duo` (`parallel: {tensor:
2, nodes: 2}`) of the sim engine on hosts b and c (a is too small for a rank), whose ranks
reproduce vLLM's behaviour (sim/ranks.py). Each run
injects one fault under a client loop: rank 1's container killed, rank 0's container killed, or
rank 1's link down for 5 s. The reference, in the same run: a poller reads rank 0's `/health`
every 0.1 s from the fault until sparkctl takes the group out of routing (after that, sparkctl's
own recreation would be what the poller sees), and for a killed rank 0, whether the worker rank
still runs then. sparkctl's figure is the daemon's `fleet_group_ejected` (its 1-token probe:
every 1 s, 3 s timeout). Recreate: the daemon's `fleet_replaced` seconds minus rank 0's engine
start (container start to /health 200) in that recreation. Goal: <= 5 s for each lie, where
plain polling still sees 200 (a dead worker, a downed link) or sees rank 0 go but leaves its
worker running.

Needs root. Run with `make perf` (or `.venv/bin/python tests/perf/bench_fleet_groups.py`).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import figure, load, runs, spread  # noqa: E402

from tests.fleet.cluster import (
    Cluster,  # noqa: E402
    HeadDaemon,  # noqa: E402
)
from tests.fleet.exposure import credential  # noqa: E402
from tests.fleet.head import FAULTS, Load, headed, inject, standalone  # noqa: E402
from tests.fleet.hosts import check_machine  # noqa: E402

RUNS = runs(3)
STACKS = {"duo": (0.2, 8951, {}, {"parallel": {"tensor": 2, "nodes": 2}})}


def main() -> None:
    print(load())
    check_machine()
    found: dict[str, list[tuple[float, float | None, float, bool]]] = {f: [] for f in FAULTS}
    with (tempfile.TemporaryDirectory(prefix="sparkctl-groups-") as tmp,
          standalone(Path(tmp)) as (hosts, image, model)):
        (Path(tmp) / "stacks").mkdir()
        with headed(hosts, image, model, Path(tmp) / "stacks", STACKS, instance="benchgroup", port=28900,
                    gateway_port=18900, up=("duo",), memory={"a": "0.3GiB"}) as (fleet, daemon):
            clients = Load(daemon.url, ["duo"])
            try:
                for _ in range(RUNS):
                    for fault in FAULTS:
                        found[fault].append(measure(fleet, daemon, fault))
            finally:
                clients.stop()
    print(f"multi-node group (2 ranks on 2 namespace hosts), fault -> out of routing, {RUNS} run(s) each; "
          "beside what plain /health polling of rank 0 saw by then")
    for fault, rows in found.items():
        caught = [r[0] for r in rows]
        polled = [r[1] for r in rows]
        plain = (f"not 200 after {spread([p for p in polled if p is not None])}" if all(p is not None for p in polled)
                 else f"still 200 when sparkctl caught it ({polled.count(None)} of {len(polled)})")
        orphans = sum(r[3] for r in rows)
        worker = f"; the worker rank still ran then in {orphans} of {len(rows)}" if fault == "rank 0 killed" else ""
        print(f"  {fault:>14}: sparkctl {spread(caught)}  {'ok' if max(caught) <= 5 else 'MISSED'} (goal <= 5 s); "
              f"plain /health: {plain}{worker}")
        figure(f"{fault}: sparkctl out of routing after", statistics.median(caught), "s", sane=(0, 120))
        if None in polled:
            figure(f"{fault}: plain /health still 200 when sparkctl caught it", polled.count(None), "runs",
                   sane=(0, len(polled)))
        else:  # a poll after the fault began: a fault is never seen before it happens
            figure(f"{fault}: plain /health not 200 after", statistics.median(polled), "s", sane=(0, 120))
    killed = [r[2] for fault, rows in found.items() if fault != "link down" for r in rows]
    linked = [r[2] for r in found["link down"]]
    print(f"  group recreate minus the engine's own start, after a killed rank: {spread(killed)}; after a downed "
          f"link (Ray declared the host dead: it waits for the host to rejoin): {spread(linked)}")
    # the daemon's own seconds, each rounded to the millisecond: the engine's start is part of the recreate
    figure("group recreate minus the engine's start, killed rank", statistics.median(killed), "s", sane=(-0.01, 600))
    figure("group recreate minus the engine's start, downed link", statistics.median(linked), "s", sane=(-0.01, 600))
    print(f"  requests through the gateway: {clients.ok['duo']} ok, {len(clients.failed['duo'])} failed "
          "(between a fault and its ejection, rank 0 answers 500: the lie itself)")
    figure("requests answered through the gateway", clients.ok["duo"], "requests", sane=(0, 10**7))
    figure("requests failed through the gateway", len(clients.failed["duo"]), "requests", sane=(0, 10**7))


def measure(fleet: Cluster, daemon: HeadDaemon, fault: str) -> tuple[float, float | None, float, bool]:
    """One fault: (sparkctl's detection, plain polling's or None, recreate minus engine start,
    whether the worker rank still ran when sparkctl caught it)."""
    ranks = fleet.book()["duo"]["ranks"]
    url = fleet.book()["duo"]["replicas"][0]["url"]
    polled: list[float] = []
    caught = threading.Event()
    orphan: list[bool] = []

    def stop_polling() -> None:
        caught.set()
        orphan.append(bool(fleet.hosts[ranks[1]].docker("ps", "-q", "--filter", "label=sparkctl.stack=duo").split()))

    poller = threading.Thread(target=poll, args=(url, credential(fleet), caught, polled), daemon=True)
    poller.start()
    done = inject(fleet, daemon, fault, "duo", caught=stop_polling)
    poller.join()
    seen_at = polled[0] - done.began if polled and polled[0] <= done.ejected["ejected_at"] else None
    return (done.ejected["ejected_at"] - done.began, seen_at, done.replaced["seconds"] - done.replaced["engine_s"],
            orphan[0])


def poll(url: str, headers: dict[str, str], caught: threading.Event, polled: list[float]) -> None:
    """Plain /health polling of rank 0 (with the fleet's relay credential, as rank 0's host relays it
    to any holder): the first moment it is not 200, until sparkctl caught the fault."""
    while not caught.is_set():
        if _status(url + "/health", headers) != 200:
            polled.append(time.time())
            return
        caught.wait(0.1)


def _status(url: str, headers: dict[str, str]) -> int | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


if __name__ == "__main__":
    main()
