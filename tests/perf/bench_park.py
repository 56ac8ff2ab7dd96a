"""Parking figures: a switch to a parked stack against a cold hold/swap of the same two stacks in
the same run, and what each parked state really holds against the planner's prediction.

Switches: two stacks that do not fit side by side (0.8 each of a GB10's 119 GiB) take turns as
`primary` under an agent loop. First with `switch.park: stop` (the old stack stops, the new one
starts cold), then with `auto` (the old one sleeps at level 1, the new one wakes). For each
switch a probe request is sent as soon as the gateway holds; its wait minus a normal request's
service time is the held time. For a wake, the cost is the held time minus the engine's own wake
(from `/wake_up` to the warm-up's answer, from the switch record). Goals: cost median <= 0.3 s;
the parked/cold ratio of held time is printed (the sim starts cold in seconds at this time scale,
a Spark in minutes: the ratio on a Spark is far smaller).

Memory: one stack on a sim engine that allocates and touches real memory
(SPARKCTL_SIM_MEMORY_SCALE) with a weights file of known size, parked at level 1, woken, parked
at level 2, woken; MemAvailable is sampled every 2 ms throughout. Each state's measured hold and
each transition's peak are printed beside what the planner predicts, by the engine's RssAnon
beyond its interpreter and by MemAvailable. Goal: within 10 % of the awake share; the level-1
wake's planned peak is a bound (it assumes vLLM #50011's wake), so there the goal is to stay
under it.

Run with `make perf` (or `.venv/bin/python tests/perf/bench_park.py`).
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_switch import STACKS, _routed, _switch_section, agent, call, held_switch  # noqa: E402
from world import daemon, figure, load, runs, sparkctl, spread, world  # noqa: E402

from sparkctl.adapters.docker import DockerEngine  # noqa: E402
from sparkctl.cli.client import DaemonClient  # noqa: E402
from sparkctl.deploy.memory import GIB, available, meminfo  # noqa: E402
from sparkctl.policy.parking import Footprint  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.fakes.tinymodel import write_model  # noqa: E402

SWITCHES = runs(10, smoke=2)
MB = 1 << 20
UNIFIED = 2 * GIB  # of this machine's memory stands for a GB10's unified memory (the sim allocates it)
AWAKE = 0.6  # the memory stack's fraction
WEIGHTS = 384 * MB  # its weights file


def main() -> None:
    print(load())
    cold, parked, costs, service = switches()
    print(f"switch to a parked stack, held time beyond the engine's own wake: {spread(costs)}; goal <= 0.3 s: "
          f"{'ok' if statistics.median(costs) <= 0.3 else 'MISSED'}")
    print(f"  held time: parked {spread(parked)}, cold hold/swap {spread(cold)}; "
          f"ratio parked/cold {statistics.median(parked) / statistics.median(cold):.3f}")
    # The probe is held through the wake: its wait beyond a normal request's service time falls short
    # of the wake only by its own service time's jitter.
    figure("switch to a parked stack, held beyond the wake", statistics.median(costs), "s",
           sane=(-2 * service, 600))
    figure("held time, parked", statistics.median(parked), "s", sane=(-2 * service, 600))
    figure("held time, cold hold/swap", statistics.median(cold), "s", sane=(0.01, 600))
    figure("held time, parked / cold", statistics.median(parked) / statistics.median(cold), "x", sane=(-1, 10))
    memory()


def switches() -> tuple[list[float], list[float], list[float], float]:
    with world() as (env, _):
        state, stacks = Path(env["SPARKCTL_STATE_DIR"]), Path(env["SPARKCTL_STACKS_DIR"])
        state.mkdir(parents=True, exist_ok=True)
        (state / "desired.yaml").write_text(f"stacks: [{STACKS[0]}]\naliases: {{primary: {STACKS[0]}}}\n")
        env |= {"SPARKCTL_GATEWAY_PORT": str(free_port()), "SPARKCTL_MEMORY_TOTAL_GIB": "119",
                "SPARKCTL_WAKE_KV_MAX_GIB": "119",  # the wake's cost is measured here, not GB10's bound on it
                "SPARKCTL_ENGINE_ENV": "SPARKCTL_SIM_TIME_SCALE=0.01,SPARKCTL_SIM_LOAD_SCALE=0.02"}
        gateway = f"http://127.0.0.1:{env['SPARKCTL_GATEWAY_PORT']}"
        client = DaemonClient(state / "sparkctl.sock")
        held: dict[str, list[float]] = {"stop": [], "auto": []}
        costs: list[float] = []
        with daemon(env):
            while not _routed(gateway):
                time.sleep(0.1)
            service = statistics.median(call(gateway) for _ in range(20))
            stop, counts = threading.Event(), {"ok": 0, "failed": 0}
            loop = threading.Thread(target=agent, args=(gateway, stop, counts))
            loop.start()
            try:
                for park in ("stop", "auto"):
                    for stack in STACKS:
                        _switch_section(stacks / f"{stack}.yaml", f"bench: 'off'\n  park: {park}")
                    for i in range(SWITCHES + (park == "auto")):  # the first `auto` switch deploys cold
                        waited, record = held_switch(client, gateway, STACKS[(i + 1) % 2], service)
                        woken = record["woken"]  # None: the new stack was not parked (the cold first)
                        if park == "stop" or woken:
                            held[park].append(waited)
                        if woken:
                            costs.append(waited - woken["seconds"])
            finally:
                stop.set()
                loop.join()
        assert counts["failed"] == 0, f"{counts['failed']} requests failed during the switches"
        return held["stop"], held["auto"], costs, service


def memory() -> None:
    with world() as (env, _):
        root = Path(env["PERF_ROOT"])
        model = write_model(root / "model", weights=False)
        with (model / "model.safetensors").open("wb") as f:
            f.truncate(WEIGHTS)  # sized, not filled: the sim and the planner only measure it
        (Path(env["SPARKCTL_STACKS_DIR"]) / "memo.yaml").write_text(
            f"name: memo\nextends: qwen36-nvfp4-stock\nmodel: {{repo: null, path: {model}}}\nallow: [host-path]\n"
            f"resources: {{gpu_memory_utilization: {AWAKE}}}\n"
            f"container: {{env: {{SPARKCTL_SIM_MEMORY_SCALE: '{UNIFIED / meminfo('MemTotal')!r}'}}}}\n")
        env |= {"SPARKCTL_MEMORY_TOTAL_GIB": repr(UNIFIED / GIB), "SPARKCTL_PARK_RESIDUE_GIB": "0",
                "SPARKCTL_ENGINE_OVERHEAD_GIB": "0",
                "SPARKCTL_GATEWAY_PORT": str(free_port()),
                "SPARKCTL_ENGINE_ENV": "SPARKCTL_SIM_TIME_SCALE=1,SPARKCTL_SIM_LOAD_SCALE=0.002"}
        footprint = Footprint(AWAKE, (WEIGHTS + _small_files(model)) / UNIFIED)
        # state -> (planned share, the engine's RssAnon, memory available)
        seen: dict[str, tuple[float, int, int]] = {}
        with daemon(env):
            sparkctl(env, "up", "memo")
            docker = DockerEngine(instance=env["SPARKCTL_INSTANCE"])
            pid = docker.client.api.inspect_container(docker.containers("memo")[0].id)["State"]["Pid"]
            seen["awake"] = (footprint.held(0), *_settled(pid))
            for level in (1, 2):
                with Sampler(pid) as sample:
                    sparkctl(env, "park", "memo", "--how", f"sleep{level}")
                seen[f"sleeping at level {level}: peak"] = (footprint.peak(level), *sample.peak)
                seen[f"parked at level {level}"] = (footprint.held(level), *_settled(pid))
                with Sampler(pid) as sample:
                    sparkctl(env, "wake", "memo")
                seen[f"waking from level {level}: peak"] = (footprint.peak(level), *sample.peak)
            sparkctl(env, "down", "memo")
    engine_alone = seen["parked at level 2"][1]  # the interpreter: at level 2 it holds nothing of the model
    awake_free = seen["awake"][2]
    print(f"memory of one stack ({AWAKE:g} of {UNIFIED / GIB:.0f} GiB awake, weights "
          f"{footprint.weights * UNIFIED / MB:.0f} MB): the engine's RssAnon beyond its interpreter, and what "
          "MemAvailable (+ per-CPU free lists) says it took beyond its planned awake share; goal within 10 % of awake")
    for what, (share, rss, free) in seen.items():
        by_rss, by_free = rss - engine_alone, int(AWAKE * UNIFIED) + awake_free - free
        off = (by_rss - share * UNIFIED) / (AWAKE * UNIFIED)
        bound = what == "waking from level 1: peak"  # planned as vLLM #50011's wake: a sound one stays under
        ok = off <= 0.10 if bound else abs(off) <= 0.10
        print(f"  {what:<30} planned {share * UNIFIED / MB:5.0f} MB{' (bound)' if bound else ''}  engine "
              f"{by_rss / MB:5.0f} MB ({off:+.1%} of awake{'' if ok else ', MISSED'})  "
              f"MemAvailable {by_free / MB:5.0f} MB")
        # Off by more than the whole awake share is a broken reading, not a planner's miss; the machine's
        # MemAvailable moves with every other process on it, so only more than the machine has is broken.
        figure(f"memory, {what}: engine off its planned share", off * 100, "% of awake", sane=(-100, 100))
        machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MB
        figure(f"memory, {what}: by MemAvailable", by_free / MB, "MB", sane=(-machine, machine))


class Sampler:
    """Every 2 ms while the block runs, on a thread: the engine's highest RssAnon and the least
    memory available (`peak`)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, (0, 1 << 62)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.done.wait(0.002):
            self.peak = (max(self.peak[0], _rss(self.pid)), min(self.peak[1], available()))


def _settled(pid: int) -> tuple[int, int]:
    """The engine's RssAnon and the memory available, once freed pages have settled."""
    time.sleep(1.5)
    return _rss(pid), available()


def _rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split("RssAnon:")[1].split()[0]) * 1024


def _small_files(model: Path) -> int:
    return sum(p.stat().st_size for p in model.iterdir() if p.name != "model.safetensors")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
