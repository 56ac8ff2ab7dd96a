"""The quality gate's cost (issue 49): what lm-eval adds to a switch, and what lm-eval itself costs
beside the plainest client that asks the same questions.

The simulated engine at its default speed (time scale 1: a Spark's decode, profile qwen36-nvfp4,
8.9 tok/s a stream) answers sparkctl's shipped task behind sparkctl's gateway (its own process).
After a warm-up, each round makes three passes over the same questions at the same concurrency
(8), taking turns:
- a plain loop: the official `openai` client (async), one chat completion per question,
  temperature 0, the last `Answer: N` line compared with the item's answer;
- the gate's measurement as the gate runs it (`bench.quality.measure`: lm-eval 0.4.13 in its
  child process, from its start to its results read back);
- the plain loop again, as a control (its ratio to the first is the method's noise).
Printed: the gate's added time at the task's default size (goal ≤ 60 s), each side's time per
item and lm-eval's ratio to the plain loop (goal ≤ 1.2×), and the accuracies both measured (the
same answers, so they must agree).

Run with `make perf` (or `.venv/bin/python tests/perf/bench_quality.py`).
"""

from __future__ import annotations

import asyncio
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import start  # noqa: E402
from world import SMOKE, figure, load, runs  # noqa: E402

from sparkctl.bench import quality  # noqa: E402
from sparkctl.bench.quality_task import arith  # noqa: E402
from sparkctl.spec.models import Quality  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.fakes.tinymodel import write_model  # noqa: E402
from tests.teardown import stop  # noqa: E402

ITEMS = 20 if SMOKE else arith.ITEMS  # the task's default size in full
SCALE = "0.1" if SMOKE else "1"  # the sim's default speed in full
ROUNDS = runs(2)
ANSWER = re.compile(r"Answer:\s*(-?\d+)")


async def plain(base_url: str, items: list[dict]) -> float:
    """Accuracy of the plain loop: each question once, CONCURRENCY at a time."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0)
    gate = asyncio.Semaphore(quality.CONCURRENCY)

    async def ask(item: dict) -> bool:
        async with gate:
            reply = await client.chat.completions.create(
                model="primary", messages=[{"role": "user", "content": item["question"]}], temperature=0,
                max_tokens=256)
        found = ANSWER.findall(reply.choices[0].message.content or "")
        return bool(found) and found[-1] == item["answer"]

    right = await asyncio.gather(*(ask(item) for item in items))
    await client.close()
    return sum(right) / len(items)


def timed(fn) -> tuple[float, float]:
    started = time.perf_counter()
    value = fn()
    return time.perf_counter() - started, value


def main() -> None:
    print(load())
    print(f"bench_quality: {ITEMS} items of sparkctl_arith, sim time scale {SCALE}, {quality.CONCURRENCY} at once")
    items = arith.generate()[:ITEMS]
    with tempfile.TemporaryDirectory(prefix="sparkctl-perf-quality-") as tmp:
        root = Path(tmp)
        model = write_model(root / "tiny", weights=False)
        sim_port, gateway_port = free_port(), free_port()
        sim = start([sys.executable, "-m", "sparkctl.sim", "serve", str(model), "--served-model-name", "tiny",
                     "--host", "127.0.0.1", "--port", str(sim_port), "--max-model-len", "4096",
                     "--sim-profile", "qwen36-nvfp4", "--disable-uvicorn-access-log"],
                    f"http://127.0.0.1:{sim_port}/health",
                    env={"SPARKCTL_SIM_TIME_SCALE": SCALE, "SPARKCTL_SIM_LOAD_SCALE": "0.001",
                         "SPARKCTL_SIM_FAULTS": "accuracy=0.9"})
        gateway = start([sys.executable, str(Path(__file__).with_name("bench_gateway.py")), "--serve-gateway",
                         str(gateway_port), f"http://127.0.0.1:{sim_port}"], f"http://127.0.0.1:{gateway_port}/health")
        base = f"http://127.0.0.1:{gateway_port}/v1"
        took: dict[str, list[float]] = {"lm-eval": [], "plain": [], "control": []}
        accuracy: dict[str, float] = {}
        try:
            asyncio.run(plain(base, items[:quality.CONCURRENCY]))  # warm: the client imported, the engine awake
            for r in range(ROUNDS):
                seconds, accuracy["plain"] = timed(lambda: asyncio.run(plain(base, items)))
                took["plain"].append(seconds)
                seconds, measured = timed(lambda r=r: quality.measure(
                    quality.Endpoint(base, "primary"), Quality(items=ITEMS, floor=0.5), folder=root / f"run{r}"))
                took["lm-eval"].append(seconds)
                accuracy["lm-eval"] = measured.accuracy
                seconds, accuracy["control"] = timed(lambda: asyncio.run(plain(base, items)))
                took["control"].append(seconds)
        finally:
            stop(gateway, 10)
            stop(sim, 10)
    report(took, accuracy)


def report(took: dict[str, list[float]], accuracy: dict[str, float]) -> None:
    gate, plain_s, control = (statistics.median(took[k]) for k in ("lm-eval", "plain", "control"))
    print(f"  the gate's added time ({ITEMS} items): {gate:.1f} s (min {min(took['lm-eval']):.1f}, "
          f"max {max(took['lm-eval']):.1f}, n={ROUNDS}); goal ≤ 60 s at 200 items")
    print(f"  per item: lm-eval {gate / ITEMS * 1000:.0f} ms, plain openai loop {plain_s / ITEMS * 1000:.0f} ms, "
          f"control {control / ITEMS * 1000:.0f} ms")
    print(f"  lm-eval / plain: {gate / plain_s:.2f}x (control {control / plain_s:.2f}x); goal ≤ 1.2x")
    print(f"  accuracy: lm-eval {accuracy['lm-eval']:.3f}, plain {accuracy['plain']:.3f}")
    figure("quality gate added time", gate, "s", sane=(0.5, 900))
    figure("quality per item lm-eval", gate / ITEMS * 1000, "ms", sane=(1, 30_000))
    figure("quality per item plain", plain_s / ITEMS * 1000, "ms", sane=(1, 30_000))
    figure("quality lm-eval to plain ratio", gate / plain_s, "x", sane=(0.3, 20),
           control="quality control to plain ratio")
    figure("quality control to plain ratio", control / plain_s, "x", sane=(0.3, 3))
    figure("quality accuracy difference", abs(accuracy["lm-eval"] - accuracy["plain"]), "fraction", sane=(-1, 0.001))


if __name__ == "__main__":
    main()
