"""Switch figures: what a cold hold/swap costs a held request beyond the new engine's own start.

A daemon serves `primary` (two stacks that do not fit side by side, so every switch holds; the
old stack stops, `switch.park: stop`: bench_park.py measures switches to parked stacks);
an agent loop keeps calling the gateway throughout. For each of 10 switches, a probe request is
sent as soon as the gateway reports the hold; its wait, minus the new engine's start (container
start to /health 200, from the switch record) and minus a normal request's service time, is the
switch cost. Goal: median ≤ 0.3 s, and 0 failed requests over all switches. Then one more
switch with the `quick` switch-over benchmark as a gate: its wall time is what the benchmark
adds to a switch (on the sim engine at the world's time scale).

Run with `make perf` (or `.venv/bin/python tests/perf/bench_switch.py`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SPARKCTL, figure, load, runs, spread, world  # noqa: E402

from sparkctl.cli.client import DaemonClient  # noqa: E402
from tests import teardown  # noqa: E402
from tests.conftest import free_port  # noqa: E402

SWITCHES = runs(10, smoke=2)
STACKS = ("qwen36-dflash", "aeon-gemma4-v2")
# The switch record's steps: the new stack staged (prepared, its container created) before the hold,
# drain the old stack, stop it, then the new one's deploy (engine start, health, canary inside it),
# and the whole switch.
STEPS = ("stage_s", "drain_s", "stop_old_s", "deploy_s", "engine_start_s", "health_s", "canary_s", "total_s")
GOAL = 0.3  # s of switch cost beyond the new engine's own start (issue 21)


def call(gateway: str, timeout: float = 120) -> float:
    """One short completion through the gateway; its latency (raises on any failure)."""
    body = json.dumps({"model": "primary", "prompt": "hi", "max_tokens": 4}).encode()
    request = urllib.request.Request(gateway + "/v1/completions", body, {"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=timeout) as response:
        json.loads(response.read())
    return time.perf_counter() - start


def holding(gateway: str) -> bool:
    return "switching" in json.loads(urllib.request.urlopen(gateway + "/health", timeout=5).read())


def agent(gateway: str, stop: threading.Event, counts: dict[str, int]) -> None:
    while not stop.is_set():
        try:
            call(gateway)
            counts["ok"] += 1
        except OSError:
            counts["failed"] += 1


def main() -> None:
    print(load())
    with world() as (env, _):
        state = Path(env["SPARKCTL_STATE_DIR"])
        state.mkdir(parents=True, exist_ok=True)
        (state / "desired.yaml").write_text(f"stacks: [{STACKS[0]}]\naliases: {{primary: {STACKS[0]}}}\n")
        for stack in STACKS:
            _switch_section(Path(env["SPARKCTL_STACKS_DIR"]) / f"{stack}.yaml", "park: stop")
        env["SPARKCTL_GATEWAY_PORT"] = str(free_port())
        gateway = f"http://127.0.0.1:{env['SPARKCTL_GATEWAY_PORT']}"
        daemon = subprocess.Popen([SPARKCTL, "daemon"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = DaemonClient(state / "sparkctl.sock")
        try:
            deadline = time.monotonic() + 120
            while not _routed(gateway):
                assert time.monotonic() < deadline and daemon.poll() is None, "the daemon did not route primary"
                time.sleep(0.1)
            service = statistics.median(call(gateway) for _ in range(20))
            stop, counts = threading.Event(), {"ok": 0, "failed": 0}
            loop = threading.Thread(target=agent, args=(gateway, stop, counts))
            loop.start()
            costs = [_cost(*held_switch(client, gateway, STACKS[(i + 1) % 2], service)) for i in range(SWITCHES)]
            _switch_section(Path(env["SPARKCTL_STACKS_DIR"]) / f"{STACKS[(SWITCHES + 1) % 2]}.yaml",
                            "park: stop\n  bench: gate")
            *_, gated = client.stream("/v1/switch", {"alias": "primary", "stack": STACKS[(SWITCHES + 1) % 2]})
            stop.set()
            loop.join()
        finally:
            teardown.stop(daemon, 30)
    cost, waited, engine, steps = ([c[i] for c in costs] for i in range(4))
    print(f"switch cost (hold/swap) beyond the engine's own start: {spread(cost)}; goal <= {GOAL} s: "
          f"{'ok' if statistics.median(cost) <= GOAL else 'MISSED'}")
    print(f"  held probe waited {spread(waited)}; new engine start {spread(engine)}; one request "
          f"{service * 1000:.0f} ms")
    print("  where the switch's time went (medians): " + ", ".join(
        f"{step} {statistics.median(s.get(step, 0.0) for s in steps) * 1000:.0f} ms" for step in STEPS))
    print(f"quick switch-over benchmark as a gate: {gated['result']['timings']['bench_s']:.2f} s added to the "
          f"switch ({gated['result']['bench']['summary']})")
    print(f"requests over all switches: {counts['ok']} answered, {counts['failed']} failed (goal 0: "
          f"{'ok' if counts['failed'] == 0 else 'MISSED'})")
    # The probe is held from before the new engine starts until it serves: its wait beyond a normal
    # request's service time falls short of the engine's start only by its own service time's jitter.
    figure("switch cost", statistics.median(cost), "s", sane=(-2 * service, 600))
    figure("held probe waited", statistics.median(waited), "s", sane=(-2 * service, 600))
    figure("new engine start", statistics.median(engine), "s", sane=(0.01, 600))
    figure("one request", service * 1000, "ms", sane=(0.1, 60_000))
    for step in STEPS:
        figure(f"switch step {step}", statistics.median(s.get(step, 0.0) for s in steps) * 1000, "ms",
               sane=(0, 600_000))
    figure("gate benchmark added to the switch", gated["result"]["timings"]["bench_s"], "s", sane=(0.01, 600))
    figure("requests answered over all switches", counts["ok"], "requests", sane=(1, 10**7))
    figure("requests failed over all switches", counts["failed"], "requests", sane=(0, 10**7))


def held_switch(client: DaemonClient, gateway: str, stack: str, service: float) -> tuple[float, dict]:
    """Switch `primary` to `stack`; a probe sent as soon as the gateway holds: how long it waited
    beyond a normal request's service time, and the switch's result."""
    outcome: dict = {}

    def run() -> None:
        *_, last = client.stream("/v1/switch", {"alias": "primary", "stack": stack})
        outcome.update(last)

    worker = threading.Thread(target=run)
    worker.start()
    while not holding(gateway):
        assert worker.is_alive(), f"the switch ended before the gateway held primary: {outcome}"
        time.sleep(0.005)
    waited = call(gateway) - service
    worker.join()
    assert outcome.get("ok"), outcome
    return waited, outcome["result"]


def _cost(waited: float, result: dict) -> tuple[float, float, float, dict[str, float]]:
    engine = result["timings"]["engine_start_s"]
    return waited - engine, waited, engine, result["timings"]


def _switch_section(path: Path, lines: str) -> None:
    """Replace the stack file's `switch:` section (the shipped files have none)."""
    path.write_text(path.read_text().split("\nswitch:\n")[0].rstrip("\n") + f"\nswitch:\n  {lines}\n")


def _routed(gateway: str) -> bool:
    try:
        models = json.loads(urllib.request.urlopen(gateway + "/v1/models", timeout=5).read())["data"]
    except OSError:
        return False
    return any(m["id"] == "primary" for m in models)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
