"""The session's closing checks (tests/conftest.py): the live-neighbour comparison
(tests/neighbours.py) and the run's leftovers (tests/leftovers.py), without Docker or root: the
hooks themselves were run against a real engine, a restarted neighbour and a leaked namespace when
they were written."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests import leftovers, neighbours, teardown
from tests.leftovers import Leftovers
from tests.neighbours import Neighbour

LIVE = Neighbour("sparkctl-qwen36-dflash", "running", "2026-12-01T10:00:00.1Z", 0)
ID = "ab" * 32


@pytest.mark.parametrize(("after", "expected"), [
    ({ID: LIVE}, []),
    ({}, [f"sparkctl-qwen36-dflash ({ID[:12]}) is gone (was running, started 2026-12-01T10:00:00.1Z)"]),
    ({ID: Neighbour(LIVE.name, "running", "2026-12-02T09:00:00.5Z", 1)},
     [f"sparkctl-qwen36-dflash ({ID[:12]}): started_at '2026-12-01T10:00:00.1Z' -> '2026-12-02T09:00:00.5Z', "
      "restart_count 0 -> 1"]),
    ({ID: Neighbour(LIVE.name, "exited", LIVE.started_at, 0)},  # stopped: its start time stays
     [f"sparkctl-qwen36-dflash ({ID[:12]}): status 'running' -> 'exited'"]),
    ({ID: LIVE, "cd" * 32: Neighbour("new", "running", "now", 0)}, []),  # a container made meanwhile is no neighbour
])
def test_a_neighbour_that_changed_or_went_is_named(after: dict, expected: list[str]) -> None:
    assert neighbours.changes({ID: LIVE}, after) == expected


@pytest.mark.parametrize(("labels", "test_runs"), [
    ({"sparkctl.test-run": "0a1b2c3d4e"}, True),
    ({"sparkctl.instance": "test-0a1b2c3d", "sparkctl.stack": "qwen36-dflash"}, True),
    ({"sparkctl.instance": "perf-0a1b2c3d"}, True),
    ({"sparkctl.instance": "live-0a1b2c3d"}, True),
    ({"sparkctl.stack": "qwen36-dflash"}, False),  # the default instance: an owner's
    ({"sparkctl.instance": "lab"}, False),
    ({"sparkctl.instance": "test-lab"}, False),  # not a name the sandbox makes
    ({}, False),
])
def test_only_containers_a_test_run_made_are_not_neighbours(labels: dict[str, str], test_runs: bool) -> None:
    assert neighbours.is_test_runs(labels) is test_runs


def test_leftovers_name_each_thing_and_the_tags_to_sweep() -> None:
    left = Leftovers(namespaces=("spk1a2b3c4d-a", "spk1a2b3c4d-b"), links=("spk1a2b3c4dbr", "spk1a2b9f9fa"),
                     processes=((4242, "sleep 300"),))
    assert left and not Leftovers()
    assert left.describe() == ["2 network namespace(s): spk1a2b3c4d-a, spk1a2b3c4d-b",
                               "2 link(s): spk1a2b3c4dbr, spk1a2b9f9fa", "1 process(es): 4242 sleep 300"]
    assert left.tags("1a2b") == {"spk1a2b3c4d", "spk1a2b9f9f"}


def test_a_process_carrying_the_runs_id_is_found_and_others_are_not() -> None:
    run = uuid.uuid4().hex[:4]
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, teardown.RUN_ENV: run})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, teardown.RUN_ENV: "other"})
    try:
        found = [pid for pid, _ in leftovers.marked(run)]
        assert found == [ours.pid]
    finally:
        teardown.stop(ours, 0)
        teardown.stop(other, 0)
    assert leftovers.marked(run) == []
