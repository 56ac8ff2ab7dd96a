"""Fleet gateway figure: what the sparkctl gateway adds to a streamed response when the engine runs
on another "host" (a network namespace on the fleet tests' bridge, as a Spark on the CX-7 link),
beside a direct connection from the gateway's host to the same engine over the same bridge.

Same method as bench_gateway.py (whose client and percentiles it reuses): 256-token streamed
completions from the sim engine at the Gemma profile's measured speed, clients started spread
over one response time, targets taking turns in rounds, a control that measures the direct path
again in its own turn (its "added" figures are the method's noise). The engine is a plain sim
process inside the namespace (no dockerd: the figure is the network path, not the container);
the gateway runs as its own process in the root namespace, routing to the engine's bridge
address. Printed per concurrency: added time to first token (p50, p99) against direct, and
decode tok/s as a ratio to direct. Goal: p50 <= 1 ms added, as on loopback.

Needs root (it creates a namespace and a bridge, removed at the end). Run with `make perf` (or
`.venv/bin/python tests/perf/bench_fleet_gateway.py`).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import SCALE, TOKENS, figures, level, pct, start  # noqa: E402
from world import SMOKE, load, runs  # noqa: E402

from tests.conftest import free_port  # noqa: E402
from tests.fakes.tinymodel import write_model  # noqa: E402
from tests.fleet import network  # noqa: E402
from tests.fleet.hosts import check_machine, sweep  # noqa: E402
from tests.teardown import stop  # noqa: E402

ROUNDS = runs(5)
REQUESTS = {1: 2, 16: 1} if SMOKE else {1: 6, 16: 2}  # concurrency -> requests per client per round
ENGINE_PORT = 8131
Row = tuple[float, float]


def main() -> None:
    print(load())
    check_machine()
    tag = network.run_tag()
    atexit.register(sweep, tag)  # if the process ends before the finally below (idempotent)
    root = Path(tempfile.mkdtemp(prefix="sparkctl-fleet-gw-"))
    procs = []
    try:
        net = network.Network(tag)
        netns, address = net.add("a")
        os.environ["no_proxy"] = os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("no_proxy"), address]))
        model = write_model(root / "model", weights=False)
        engine = f"http://{address}:{ENGINE_PORT}"
        procs.append(start(["nsenter", f"--net={network.NETNS_DIR / netns}", sys.executable, "-m", "sparkctl.sim",
                            "serve", str(model), "--served-model-name", "tiny", "--host", address,
                            "--port", str(ENGINE_PORT), "--max-model-len", "4096",
                            "--sim-profile", "aeon-gemma4-nospec"],
                           engine + "/health", {"SPARKCTL_SIM_TIME_SCALE": SCALE, "SPARKCTL_SIM_LOAD_SCALE": "0"}))
        port = free_port()
        procs.append(start([sys.executable, str(Path(__file__).parent / "bench_gateway.py"), "--serve-gateway",
                            str(port), engine], f"http://127.0.0.1:{port}/health"))
        targets = {"direct": (engine, "tiny"), "sparkctl": (f"http://127.0.0.1:{port}", "primary"),
                   "control": (engine, "tiny")}
        print(f"gateway overhead, engine on another host ({address}, a namespace on the bridge), "
              f"{TOKENS}-token streamed completions, sim engine (Gemma profile)")
        print(f"{'conc':>4} {'target':>9} {'added TTFT p50':>15} {'p99':>9} {'decode ratio':>13}  goal: p50 <= 1 ms")
        for concurrency, requests in REQUESTS.items():
            asyncio.run(level(engine, "tiny", concurrency, 1))  # warms the engine at this load, not measured
            results: dict[str, list[Row]] = {name: [] for name in targets}
            names = list(targets)
            for turn in range(ROUNDS):
                for name in names[turn % len(names):] + names[:turn % len(names)]:
                    results[name] += asyncio.run(level(*targets[name], concurrency, requests))
            report(concurrency, results)
    finally:
        for proc in procs:  # never raises: a process slow to exit is killed, and the sweep always runs
            stop(proc, 10)
        sweep(tag)
        shutil.rmtree(root, ignore_errors=True)


def report(concurrency: int, results: dict[str, list[Row]]) -> None:
    ttft = {name: [r[0] * 1000 for r in rows] for name, rows in results.items()}
    decode = {name: statistics.mean(r[1] for r in rows) for name, rows in results.items()}
    for name in ("sparkctl", "control"):
        p50 = pct(ttft[name], 50) - pct(ttft["direct"], 50)
        p99 = pct(ttft[name], 99) - pct(ttft["direct"], 99)
        ratio = decode[name] / decode["direct"]
        note = "(direct again: the noise)" if name == "control" else ("ok" if p50 <= 1 else "MISSED")
        print(f"{concurrency:>4} {name:>9} {p50:>12.2f} ms {p99:>6.2f} ms {ratio:>13.3f}  {note}")
    print(f"{concurrency:>4} {'direct':>9}   TTFT p50 {pct(ttft['direct'], 50):.2f} ms, p99 "
          f"{pct(ttft['direct'], 99):.2f} ms, decode {decode['direct']:.0f} tok/s per stream, "
          f"{len(results['direct'])} requests per target")
    figures(f"conc {concurrency}", ttft, decode, ("sparkctl",))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
