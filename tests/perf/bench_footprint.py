"""sparkctl's own footprint on unified memory: every MB it holds is one a model cannot.

Measured in one run, each process by its PSS (its private pages plus its share of those it shares,
so a sum counts a shared library once) and RSS, from /proc:
- the daemon, whose process serves the gateway too: with one stack and with three running, idle
  and at its peak under a load of 8 OpenAI clients through the gateway;
- this Spark as a fleet's head (`sparkctl fleet init` on a loopback address): Ray's processes of
  its node (GCS, raylet, their agents) and the host agent's actor, beside the daemon.
Goals: <= 150 MB in all for a single Spark without a fleet, <= 600 MB with the Ray head.

Run with `make perf` (or `.venv/bin/python tests/perf/bench_footprint.py`); needs root only for
nothing, and touches only its own instance's containers and its own Ray node."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SMOKE, daemon, figure, load, sparkctl, world  # noqa: E402

from sparkctl.adapters import processes  # noqa: E402
from sparkctl.fleet import local  # noqa: E402

THREE = ("print-a", "print-b", "print-c")
LOAD_S, SETTLE = (3, 2) if SMOKE else (15, 10)  # s of load; s for the series' samples and a reconcile pass
HEAD, RAY_PORT = "127.0.0.2", 27700


def memory(pid: int) -> tuple[float, float]:
    """(PSS, RSS) of a process in MB; (0, 0) once it is gone."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
    except OSError:
        return 0.0, 0.0
    kb = {line.split(":")[0]: int(line.split()[1]) for line in rollup[1:] if line.split()[-1] == "kB"}
    return kb.get("Pss", 0) / 1024, kb.get("Rss", 0) / 1024


def name_of(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    found = next((w for w in words if w.startswith("ray::") or w.endswith((".py", "gcs_server", "raylet"))),
                 words[0] if words else "?")
    return Path(found.split()[0]).name if "/" in found else found[:40]


def under_load(env: dict[str, str], pid: int) -> float:
    """The daemon's peak PSS (MB) while 8 clients ask the gateway for completions for LOAD_S s."""
    import openai

    url = f"http://127.0.0.1:{env['SPARKCTL_GATEWAY_PORT']}/v1"
    stop, peak = threading.Event(), [0.0]

    def client() -> None:
        ask = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        while not stop.is_set():
            ask.completions.create(model="primary", prompt="x", max_tokens=16)

    clients = [threading.Thread(target=client) for _ in range(8)]
    for c in clients:
        c.start()
    ends = time.monotonic() + LOAD_S
    while time.monotonic() < ends:
        peak[0] = max(peak[0], memory(pid)[0])
        time.sleep(0.2)
    stop.set()
    for c in clients:
        c.join(60)
    return peak[0]


def ray_head(env: dict[str, str], root: Path) -> list[tuple[str, float, float]]:
    """Start this Spark as a fleet's head on a loopback address, its host agent included; each of
    its node's processes (name, PSS, RSS) once it has settled."""
    fleet = root / "fleet.yaml"
    fleet.write_text(f"head: a\nhosts:\n  - {{name: a, serving: {{interface: lo, address: {HEAD}}}, memory: 4GiB, "
                     f"ray: {{address: {HEAD}, port: {RAY_PORT}}}}}\n")
    env |= {"SPARKCTL_FLEET_FILE": str(fleet), "SPARKCTL_FLEET_NUM_CPUS": "1"}
    sparkctl(env, "fleet", "init")
    time.sleep(5)  # its agents' start over
    record = local.read_record(Path(env["SPARKCTL_STATE_DIR"]) / "fleet" / local.RECORD_FILE)
    session = processes.Session.from_dict(record.handle)
    return [(name_of(p.pid), *memory(p.pid)) for p in processes.alive(session)]


def main() -> None:
    print(load())
    with world() as (env, _hub), tempfile.TemporaryDirectory(prefix="sf", dir="/tmp") as short:
        env |= {"SPARKCTL_STATE_DIR": str(Path(short) / "state")}  # Ray's sockets need a short path
        stacks = Path(env["PERF_ROOT"]) / "stacks"
        for i, name in enumerate(THREE):
            (stacks / f"{name}.yaml").write_text(f"name: {name}\nextends: qwen36-nvfp4-stock\nvllm:\n  "
                                                 f"port: {8191 + i}\nresources:\n  gpu_memory_utilization: 0.25\n")
        with daemon(env) as proc:
            sparkctl(env, "up", THREE[0])
            sparkctl(env, "switch", THREE[0])
            time.sleep(SETTLE)
            one = memory(proc.pid)
            for name in THREE[1:]:
                sparkctl(env, "up", name)
            time.sleep(SETTLE)
            three = memory(proc.pid)
            peak = under_load(env, proc.pid)
            try:
                ray = ray_head(env, Path(short))
            finally:
                subprocess.run([sys.executable, "-m", "sparkctl", "fleet", "leave"], env=env, capture_output=True,
                               timeout=120)
            with_ray = memory(proc.pid)
            for name in THREE:
                sparkctl(env, "down", name)
    ray_pss = sum(p for _, p, _ in ray)
    print(f"daemon (the gateway in its process), PSS / RSS: one stack idle {one[0]:.0f} / {one[1]:.0f} MB; three "
          f"stacks idle {three[0]:.0f} / {three[1]:.0f} MB; peak under 8 clients for {LOAD_S} s {peak:.0f} MB PSS")
    print(f"  single Spark without a fleet: {max(three[0], peak):.0f} MB at most (goal <= 150 MB: "
          f"{'met' if max(three[0], peak) <= 150 else 'missed'})")
    each = ", ".join(f"{n} {p:.0f}" for n, p, _ in sorted(ray, key=lambda x: -x[1]))
    print(f"Ray head with the host agent, {len(ray)} processes, PSS {ray_pss:.0f} MB (RSS "
          f"{sum(r for _, _, r in ray):.0f} MB): {each}")
    print(f"  with the Ray head: {with_ray[0] + ray_pss:.0f} MB in all (goal <= 600 MB: "
          f"{'met' if with_ray[0] + ray_pss <= 600 else 'missed'})")
    figure("footprint_daemon_three_idle", three[0], "MB", sane=(20.0, 400.0))
    figure("footprint_daemon_peak_loaded", peak, "MB", sane=(20.0, 600.0))
    figure("footprint_with_ray_head", with_ray[0] + ray_pss, "MB", sane=(50.0, 2000.0))


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()
