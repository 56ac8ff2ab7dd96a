"""The sentinel against the machine's real memory: a sim engine that grows (the `grow_mib` fault,
real pages written) drives MemAvailable towards the floor, and the sentinel stops it, the engine
that grew last, while the older one serves on.

Reads MemAvailable, which every process on the machine moves: part of the `memory` tier, which
`scripts/tiers.sh` runs alone."""

from __future__ import annotations

import json
import os
import urllib.request

from sparkctl.deploy.memory import GIB
from tests.conftest import name
from tests.integration.conftest import SMALL, wait_for
from tests.integration.memory.test_wake_memory import MB, settled_available

GROWS_MIB = 2048


def serves(stack: str) -> bool:
    body = json.dumps({"model": stack, "prompt": "hi", "max_tokens": 2}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status == 200
    except OSError:
        return False


def test_an_engine_that_grows_towards_the_floor_is_stopped(world, start_daemon, cli, engine, monkeypatch) -> None:
    (world / "stacks" / "steady.yaml").write_text("name: steady\nextends: qwen36-nvfp4-stock\n" + SMALL)
    (world / "stacks" / "grower.yaml").write_text(
        "name: grower\nextends: qwen36-dflash\n" + SMALL +
        f"container:\n  env:\n    SPARKCTL_SIM_FAULTS: grow_mib={GROWS_MIB},grow_s=6\n")
    # The floor sits 1.5 GB under what is available now: the daemon and the two engines' processes
    # (~100-150 MB each), and steady's load seen as a slope over the sentinel's 5 s horizon
    # (~100 MB/s here: 500 MB), stay above it; the grower's 2 GB crosses it.
    floor = settled_available() - 1536 * MB
    monkeypatch.setenv("SPARKCTL_MEMINFO_PATH", "/proc/meminfo")
    monkeypatch.setenv("SPARKCTL_WAKE_MEMORY_FLOOR_GIB", repr(floor / GIB))
    (world / "state").mkdir(exist_ok=True)
    (world / "state" / "desired.yaml").write_text("stacks: [steady]\n")
    daemon = start_daemon()
    wait_for(lambda: serves("steady"), timeout=60, what="steady served", logs=daemon.logs)
    assert cli("up", "grower")[0] == 0  # the newest engine, and it grows once it serves
    wait_for(lambda: '"sentinel_stopped_engine"' in daemon.logs(), timeout=90, what="the sentinel's stop",
             logs=daemon.logs)
    [stop] = [json.loads(x) for x in daemon.logs().splitlines() if '"sentinel_stopped_engine"' in x]
    assert stop["stack"] == "grower" and stop["sign"] in ("memory_low", "memory_falling"), stop
    assert engine.inspect(name("grower")).status != "running"
    assert engine.inspect(name("steady")).status == "running" and serves("steady")
    assert settled_available() > floor  # its memory came back
