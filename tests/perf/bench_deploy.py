"""Deploy figures, each printed beside its reference:

- orchestration overhead of `sparkctl up` (image and weights cached): its wall time minus the
  engine's own start (container start to the first /health 200, seen by an independent poller),
  in-process and through a running daemon (goal <= 0.5 s);
- a repeated `up` of an unchanged running stack, in-process (goal <= 0.3 s, no restart);
- download time of sparkctl's weights step against the client's own best, plain
  `snapshot_download` at its default max_workers and at 16, of the same safetensors-shaped repo
  from the same local Hub, runs interleaved (goal: ratio of medians >= 0.98).

Run with `make perf` (or `.venv/bin/python tests/perf/bench_deploy.py`).
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SMOKE, daemon, load, runs, sparkctl, spread, world  # noqa: E402

from sparkctl.instance import container_name  # noqa: E402
from sparkctl.sim.hub import Hub, Repo  # noqa: E402

STACK, SHIPPED_PORT = "qwen36-dflash", 8107
RUNS = runs(5)
DOWNLOAD_MIB = 16 if SMOKE else 512  # the weights' four safetensors shards together
DOWNLOAD_RUNS, WEIGHTS = runs(3), "perf/weights"


def first_healthy(stop: threading.Event, seen: list[float], port: int) -> None:
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                if r.status == 200:
                    seen.append(time.time())
                    return
        except OSError:
            pass
        time.sleep(0.005)


def container_started(env: dict[str, str]) -> float:
    name = container_name(STACK, env["SPARKCTL_INSTANCE"])
    out = subprocess.run(["docker", "inspect", "-f", "{{.State.StartedAt}}", name],
                         capture_output=True, text=True, check=True).stdout.strip()
    return dt.datetime.fromisoformat(out.replace("Z", "+00:00")[:26] + "+00:00").timestamp()


def overhead(env: dict[str, str]) -> tuple[float, float, float]:
    sparkctl(env, "down", STACK)
    seen: list[float] = []
    stop = threading.Event()
    port = SHIPPED_PORT + int(env["SPARKCTL_PORT_OFFSET"])
    poller = threading.Thread(target=first_healthy, args=(stop, seen, port))
    poller.start()
    start = time.perf_counter()
    sparkctl(env, "up", STACK)
    wall = time.perf_counter() - start
    stop.set()
    poller.join()
    engine = seen[0] - container_started(env)
    return wall, engine, wall - engine


def repeated(env: dict[str, str]) -> float:
    start = time.perf_counter()
    out = sparkctl(env, "up", STACK).stdout
    assert "unchanged" in out, out
    return time.perf_counter() - start


PLAIN = """
import sys, time
from huggingface_hub import snapshot_download
workers = {"max_workers": int(sys.argv[4])} if len(sys.argv) > 4 else {}
t = time.perf_counter()
snapshot_download(sys.argv[1], cache_dir=sys.argv[2], endpoint=sys.argv[3], **workers)
print(time.perf_counter() - t)
"""
OURS = """
import sys, time
from pathlib import Path
from huggingface_hub import HfApi, snapshot_download  # imported before the clock, as in PLAIN
from sparkctl.adapters.hub import HubClient
from sparkctl.deploy import weights
from sparkctl.deploy.progress import RecordingReporter
from sparkctl.spec.engine import Weights
from sparkctl.state.store import Store
root = Path(sys.argv[2])
hub = HubClient(cache_dir=root / "hub", endpoint=sys.argv[3])
store = Store(root / "state.db")  # opened once per process by the pipeline, not by the weights step
t = time.perf_counter()
weights.fetch(Weights(repo=sys.argv[1]), hub=hub, store=store, refresh=False, reporter=RecordingReporter(),
              stack="perf", label="model")
print(time.perf_counter() - t)
"""
# side -> (script, extra arguments); the plain sides are the reference, the faster of them counts
SIDES = {"sparkctl": (OURS,), "plain, default max_workers": (PLAIN,), "plain, max_workers=16": (PLAIN, "16")}


def weights_repo() -> Repo:
    """Shaped like a safetensors checkpoint (four equal shards, their index, config and tokenizer
    files), so each client downloads several files at once as it would real weights."""
    shards = {f"model-{i:05d}-of-00004.safetensors": os.urandom((DOWNLOAD_MIB << 20) // 4) for i in range(1, 5)}
    index = {"metadata": {"total_size": DOWNLOAD_MIB << 20},
             "weight_map": {f"model.layers.{i}.weight": name for i, name in enumerate(shards)}}
    return Repo(shards | {"model.safetensors.index.json": json.dumps(index).encode(),
                          "config.json": b'{"model_type": "llama"}', "generation_config.json": b"{}",
                          "tokenizer.json": os.urandom(1 << 20), "tokenizer_config.json": b"{}"})


def download(env: dict[str, str], hub: Hub) -> dict[str, list[float]]:
    """Seconds per run of each side, same repo, same Hub. The sides alternate, in an order rotated
    each round so none always follows the same one; every run starts from an empty cache, deleted
    after it so the next one finds the disk and page cache alike."""
    hub.repos[WEIGHTS] = weights_repo()
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    sides = list(SIDES)
    for round_ in range(DOWNLOAD_RUNS):
        for n, side in enumerate(sides[round_ % len(sides):] + sides[:round_ % len(sides)]):
            code, *args = SIDES[side]
            cache = Path(env["PERF_ROOT"]) / "download" / f"{round_}.{n}"
            cache.mkdir(parents=True)
            out = subprocess.run([sys.executable, "-c", code, WEIGHTS, str(cache), env["PERF_HUB"], *args],
                                 capture_output=True, text=True, check=True).stdout
            times[side].append(float(out))
            shutil.rmtree(cache)
    del hub.repos[WEIGHTS]
    return times


def download_report(times: dict[str, list[float]]) -> str:
    """Each side's spread and the ratio of medians, reference (the faster plain side) over sparkctl."""
    medians = {side: statistics.median(t) for side, t in times.items()}
    reference = min(m for side, m in medians.items() if side != "sparkctl")
    xet = "installed" if importlib.util.find_spec("hf_xet") else "not installed"
    return "\n".join([
        f"download of {DOWNLOAD_MIB} MiB in 4 shards (+ index, config, tokenizer) from the local Hub, "
        "each run into an empty cache, sides interleaved:",
        *(f"  {side}: {spread(t)}; {DOWNLOAD_MIB / medians[side]:.0f} MiB/s" for side, t in times.items()),
        f"  ratio of medians, best plain / sparkctl: {reference / medians['sparkctl']:.3f} (goal >= 0.98)",
        f"  hf_xet {xet} but used by neither side: huggingface_hub downloads a file through it only when the Hub "
        "names the file's Xet hash",
        "  (`xetHash` in its /tree entry, or X-Xet-Hash plus X-Xet-Refresh-Route or Link rel=xet-auth on its "
        "/resolve HEAD); the local Hub sends neither, so every file is one HTTP GET.",
        "  On huggingface.co both sides take the same Xet path: sparkctl calls the same snapshot_download."])


def main() -> None:
    print(load())
    with world() as (env, hub):
        sparkctl(env, "up", STACK)  # warm: image pulled, weights downloaded, patches written
        measured = [overhead(env) for _ in range(RUNS)]
        again = [repeated(env) for _ in range(RUNS)]
        with daemon(env):  # the same `sparkctl up`, answered by a running daemon
            sparkctl(env, "up", STACK)
            served = [overhead(env) for _ in range(RUNS)]
        downloads = download(env, hub)
    for how, runs_ in (("in-process, no daemon", measured), ("through the daemon", served)):
        wall, engine, over = ([r[i] for r in runs_] for i in range(3))
        print(f"orchestration overhead of `sparkctl up`, {how}: {spread(over)}; goal <= 0.500 s")
        print(f"  `sparkctl up` {spread(wall)}; the engine's own start {spread(engine)}")
    print(f"repeated `sparkctl up`, unchanged, in-process without a daemon: {spread(again)}; goal <= 0.300 s "
          "(bench_daemon.py measures it through the daemon)")
    print(download_report(downloads))


if __name__ == "__main__":
    main()
