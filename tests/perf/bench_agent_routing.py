"""Seconds per agent session: the long session (30 calls, to ~128K tokens) through DFlash alone,
its no-spec twin alone, and a routed alias (up to 8192 prompt tokens to DFlash, the rest to the
twin), side by side in one run; and what counting a prompt's tokens adds at the gateway.

The engines are two simulated ones calibrated to seed 000 (`qwen36-dflash-n8`: 26 -> 21 tok/s
through 8K, below no-spec past its cliff; `qwen36-nvfp4`: 8.9 -> 7.7 tok/s), co-resident at 0.50
and 0.45 of the GB10's memory (each holds a 128K session's KV cache). DFlash runs without prefix
caching (with this draft it hangs: qwen36-dflash.yaml), so it prefills the whole history on
every call. The twin runs twice: as seed 000 benchmarked it (prefix caching off), and with vLLM's
default prefix caching, as an agent's long-context stack should; the routed alias pays one full
prefill on the twin where it crosses over.

Time: the engines run at SPARKCTL_SIM_TIME_SCALE (0.01: a Spark's second is 10 ms here) and count
the engine time their profile gave each request in a Spark's seconds
(`sparkctl_sim_engine_seconds_total`). A call's time on a Spark is that engine time plus what
the call took here beyond its scaled-down engine time (the gateway, the token count, HTTP and
JSON, the sim's own tokenizing), unscaled: overheads weigh what they weigh, not 100x. A
session's time is the sum of its calls' (the agent's wait). Goal (issue 19): routed <= 0.95 x
the better single stack.

The counting cost: p50 of the gateway's prompt count (chat template rendered, then tokenized)
for a 2K- and a 64K-token chat prompt with the tiny model's tokenizer, beside the prompt's own
prefill time on a Spark at the profile's prefill rate. Goal: <= 1 ms at 2K; at 64K well under
the prefill.

Run with `make perf` (or `.venv/bin/python tests/perf/bench_agent_routing.py`).
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import openai  # noqa: E402
from bench_gateway import start  # noqa: E402
from world import SMOKE, figure, load, runs  # noqa: E402

from sparkctl.bench import agent, corpus  # noqa: E402
from sparkctl.gateway import tokens  # noqa: E402
from sparkctl.sim.profiles import PROFILES  # noqa: E402
from tests.conftest import Running, free_port  # noqa: E402
from tests.fakes.tinymodel import write_model  # noqa: E402
from tests.teardown import stop  # noqa: E402

SCALE = 0.01
THRESHOLD = 8192
SHAPE = "short" if SMOKE else "long"
COUNTS = runs(200, smoke=5)


DFLASH, TWIN = "qwen36-dflash", "qwen36-nvfp4-aeon"
SIMS = {DFLASH: ("qwen36-dflash-n8", "0.50"), TWIN: ("qwen36-nvfp4", "0.45")}
ENGINE_S = re.compile(r"^sparkctl_sim_engine_seconds_total\{[^}]*\} (\S+)$", re.M)


def engine(model: Path, stack: str, *flags: str) -> tuple[str, subprocess.Popen]:
    profile, fraction = SIMS[stack]
    url = f"http://127.0.0.1:{free_port()}"
    return url, start([sys.executable, "-m", "sparkctl.sim", "serve", str(model), "--served-model-name", "tiny",
                       "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1], "--max-model-len", "140000",
                       "--sim-profile", profile, "--gpu-memory-utilization", fraction, *flags], url + "/health",
                      env={"SPARKCTL_SIM_TIME_SCALE": str(SCALE), "SPARKCTL_SIM_LOAD_SCALE": "0.001",
                           "VLLM_SERVER_DEV_MODE": "1"})  # /reset_prefix_cache between sessions


def gateway(urls: dict[str, str], model: Path) -> Running:
    from sparkctl.gateway.proxy import Gateway
    from sparkctl.gateway.routes import RouteTable, Upstream
    from sparkctl.policy.routing import Rule

    table = RouteTable(upstreams={s: Upstream(s, u, "tiny") for s, u in urls.items()},
                       rules={"primary": (Rule(DFLASH, THRESHOLD), Rule(TWIN))})
    proxy = Gateway(lambda: table)
    proxy.counters = tokens.Counters(lambda _: model)
    return Running(proxy)


def engine_s(urls: dict[str, str]) -> float:
    """The engine time (a Spark's seconds) all the engines have spent so far."""
    return sum(float(v) for url in urls.values()
               for v in ENGINE_S.findall(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()))


def on_spark(url: str, urls: dict[str, str], model: str,
             fill: agent.Filler) -> list[tuple[agent.Call, float, float]]:
    """One session against `model`: each call with its time on a Spark and, of that, what ran
    here beyond the engine's scaled time."""
    for engine_url in urls.values():  # a new session finds no prefix of its own in any cache
        urllib.request.urlopen(urllib.request.Request(engine_url + "/reset_prefix_cache", method="POST"), timeout=10)
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    timed, mark = [], [engine_s(urls)]

    def spark(call: agent.Call) -> None:
        mark.append(engine_s(urls))
        spent = mark[-1] - mark[-2]
        overhead = call.total_s - spent * SCALE
        timed.append((call, spent + overhead, overhead))

    agent.run(client, model, agent.shape(SHAPE), fill, engines=urls, on_call=spark)
    return timed


def counting(model: Path, text: str) -> None:
    counter = tokens.load(model)
    prefill = PROFILES["qwen36-nvfp4"]
    for size in (2048, 65536):
        words = text.split()
        lo, hi = 1, len(words)
        while lo < hi:  # the most words whose prompt stays within `size` tokens
            mid = (lo + hi + 1) // 2
            payload = {"messages": [{"role": "user", "content": " ".join(words[:mid])}]}
            lo, hi = (mid, hi) if counter.count("/v1/chat/completions", payload) <= size else (lo, mid - 1)
        payload = {"messages": [{"role": "user", "content": " ".join(words[:lo])}]}
        n = counter.count("/v1/chat/completions", payload)
        spark = n / prefill.prefill_tps(n)
        for what, limit in (("full count", 0), (f"routing decision at {THRESHOLD}", THRESHOLD)):
            took = []
            for _ in range(COUNTS):
                began = time.perf_counter()
                counter.at_most("/v1/chat/completions", payload, limit)
                took.append(time.perf_counter() - began)
            p50 = statistics.median(took)
            print(f"prompt of {n} tokens ({len(payload['messages'][0]['content'].encode())} bytes), {what}: p50 "
                  f"{p50 * 1e3:.3f} ms (min {min(took) * 1e3:.3f}, max {max(took) * 1e3:.3f}, n={len(took)}); "
                  f"its own prefill on a Spark {spark:.1f} s; ratio {p50 / spark:.5f}")
            figure(f"prompt of {size // 1024}K tokens, {what}", p50 * 1e3, "ms", sane=(1e-4, 60_000))
            figure(f"prompt of {size // 1024}K tokens, {what}, over its own prefill", p50 / spark, "x",
                   sane=(0, 1))


def main() -> None:
    print(load())
    model = write_model(Path(tempfile.mkdtemp(prefix="agent-bench-")) / "tiny", weights=False)
    text = corpus.text(120_000)
    counting(model, text)
    fill = agent.Filler(tokens.load(model).tokenizer, text)
    results: dict[str, list[tuple[agent.Call, float, float]]] = {}
    dflash_url, dflash = engine(model, DFLASH)
    try:
        for twin_caches in (False, True):
            twin_url, twin = engine(model, TWIN, *(["--enable-prefix-caching"] if twin_caches else []))
            urls = {DFLASH: dflash_url, TWIN: twin_url}
            running = gateway(urls, model)
            try:
                for target in ((DFLASH,) if not twin_caches else ()) + (TWIN, "primary"):
                    label = target if target == DFLASH else f"{target} ({'with' if twin_caches else 'no'} prefix cache)"
                    results[label] = on_spark(running.url, urls, target, fill)
            finally:
                running.stop()
                stop(twin, 10)
    finally:
        stop(dflash, 10)
    for label, calls in results.items():
        waits = [spark for _, spark, _ in calls]
        overhead = sum(overhead for *_, overhead in calls)
        by = {s: sum(1 for c, *_ in calls if c.stack == s) for s in (DFLASH, TWIN)}
        print(f"{SHAPE} session via {label}: {sum(waits):.0f} s on a Spark ({len(calls)} calls, to "
              f"{calls[-1][0].context} tokens; wait per call median {statistics.median(waits):.1f} s, worst "
              f"{max(waits):.1f} s; of it beyond the engine {overhead:.2f} s; calls by stack {by})")
        figure(f"{SHAPE} session via {label}", sum(waits), "s on a Spark", sane=(1, 10**6))
        # The engines' sleeps never end early: beyond them, the calls lose time only to the clocks' grain.
        figure(f"{SHAPE} session via {label}, beyond the engine", overhead, "s", sane=(-0.1, 3600))
    for caches in ("no", "with"):
        routed, dflash, twin = (sum(spark for _, spark, _ in results[label]) for label in (
            f"primary ({caches} prefix cache)", DFLASH, f"{TWIN} ({caches} prefix cache)"))
        best = min(dflash, twin)
        print(f"twin {caches} prefix cache: routed / better single stack {routed / best:.3f} (goal <= 0.95)")
        figure(f"twin {caches} prefix cache: routed / better single stack", routed / best, "x", sane=(0.2, 5))


if __name__ == "__main__":
    main()
