"""The simulated engine behaves like vLLM where sparkctl looks: loading, API shapes, metrics,
speeds from its profile, patch checks and injected faults."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest

from sparkctl.sim.profiles import PROFILES

SCALE = 0.01
DECODE_S = 'sparkctl_sim_engine_seconds_total{engine="0",model_name="tiny",phase="decode"}'


def post(url: str, body: dict) -> tuple[int, dict | list[dict]]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read().decode()
            if body.get("stream"):
                events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
                assert events[-1] == "[DONE]"
                return r.status, [json.loads(e) for e in events[:-1]]
            return r.status, json.loads(raw)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics") as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name if "position" in name or "phase" in name else re.sub(r"\{.*\}", "", name)] = float(value)
    return found


def test_port_refuses_while_loading_then_health_200(sim) -> None:
    engine = sim("--sim-profile", "aeon-gemma4-v2", scale=0.02)  # ~2.4 s of loading
    engine.wait_logged("Loading weights (")
    assert engine.status() is None
    engine.wait_ready()
    assert engine.status("/health") == 200
    with urllib.request.urlopen(engine.url + "/v1/models") as r:
        card = json.load(r)["data"][0]
    assert (card["id"], card["max_model_len"]) == ("tiny", 70000)


def test_diffusiongemma_starts_as_seed_003_says_and_faster_with_its_compile_cached(sim, tmp_path) -> None:
    """Seed 003: 2 min a start with the compile cached, and torch.compile 31.5 s cold: the first
    start into an empty cache compiles, the next loads the graphs it left there."""
    cache = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm")}  # the sim image names vLLM's default
    starts = []
    for _ in range(2):
        engine = sim("--sim-profile", "diffusiongemma", scale=0.0001, env=cache)
        engine.wait_ready()
        starts.append(engine.logs())
        engine.stop()
    seconds = [float(re.search(r"Loading weights took ([\d.]+) seconds", log)[1])
               + float(re.search(r"torch.compile takes ([\d.]+) s in total", log)[1]) for log in starts]
    assert "Compiling a graph for dynamic shape takes 31.50 s" in starts[0]
    assert "Directly load the compiled graph(s) from the cache" in starts[1]
    assert seconds == [pytest.approx(120 - 5 + 31.5), pytest.approx(120)]  # cold, then seed 003's 2 min


def test_a_calibrated_profile_file_replaces_the_named_one(sim, tmp_path) -> None:
    from sparkctl.sim import calibrate

    mine = calibrate.fit([{"benchmarks": [{"context_size": 0, "prompt_size": 512, "response_size": 256,
                                           "concurrency": 1, "tg_throughput": {"mean": 33.0}}]}],
                         PROFILES["aeon-gemma4-v2"], "my-spark")
    (tmp_path / "mine.json").write_text(calibrate.dumps(mine))
    chosen = {"SPARKCTL_SIM_PROFILE_FILE": str(tmp_path / "mine.json")}
    engine = sim("--sim-profile", "qwen36-nvfp4", scale=0.001, env=chosen)
    engine.wait_ready()
    assert "sim profile my-spark)" in engine.logs()
    (tmp_path / "mine.json").write_text("{}")
    broken = sim(scale=0.001, env=chosen)
    assert broken.proc.wait(30) == 1 and "mine.json: not a sim profile" in broken.logs()


def test_chat_stream_shapes_and_usage(sim) -> None:
    engine = sim("--sim-profile", "aeon-gemma4-v2", scale=0.001)
    engine.wait_ready()
    status, chunks = post(engine.url + "/v1/chat/completions", {
        "model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 20,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 20
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text.strip()


def test_min_tokens_and_max_tokens(sim) -> None:
    engine = sim("--sim-profile", "aeon-gemma4-v2", scale=0.001)
    engine.wait_ready()
    _, body = post(engine.url + "/v1/completions",
                   {"model": "tiny", "prompt": "x", "max_tokens": 100, "min_tokens": 90})
    assert 90 <= body["usage"]["completion_tokens"] <= 100
    _, body = post(engine.url + "/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 5})
    assert body["usage"]["completion_tokens"] <= 5 and body["object"] == "text_completion"
    status, body = post(engine.url + "/v1/completions", {"model": "other", "prompt": "x"})
    assert status == 404 and "does not exist" in body["error"]["message"]


def test_metrics_follow_served_tokens(sim) -> None:
    engine = sim("--sim-profile", "qwen36-dflash-n8", "--speculative-config",
                 '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}', scale=0.001)
    engine.wait_ready()
    before = metrics(engine.url)
    post(engine.url + "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 64, "ignore_eos": True})
    after = metrics(engine.url)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 64
    drafted = after["vllm:spec_decode_num_draft_tokens_total"]
    assert drafted > 0 and 0 < after["vllm:spec_decode_num_accepted_tokens_total"] <= drafted


def test_prefix_caching_skips_the_prefill_of_cached_blocks(sim) -> None:
    """With --enable-prefix-caching a prompt's leading whole blocks seen before are not prefilled
    again (the last token always is); a shared prefix counts, a reset empties the cache, and
    without the flag every prompt is prefilled whole. The engine's own time (in a Spark's
    seconds) shows it, beside vLLM's prefix-cache counters."""
    cached, plain = (sim("--sim-profile", "qwen36-nvfp4", "--gpu-memory-utilization", "0.5", *flag, scale=0.001,
                         env={"VLLM_SERVER_DEV_MODE": "1"})  # /reset_prefix_cache
                     for flag in (["--enable-prefix-caching"], []))
    history = " ".join(f"turn {i} of a long agent session" for i in range(400))
    for engine in (cached, plain):
        engine.wait_ready()
        spent = []
        for prompt in (history, history, history + " and a new tool result", "reset", history):
            if prompt == "reset":
                assert post(engine.url + "/reset_prefix_cache", {})[0] == 200
                continue
            before = metrics(engine.url)
            _, reply = post(engine.url + "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 1})
            after = metrics(engine.url)
            delta = {k: after[k] - before[k] for k in ('sparkctl_sim_engine_seconds_total{engine="0",model_name="tiny",'
                                                       'phase="prefill"}', "vllm:prefix_cache_hits_total")}
            spent.append((reply["usage"]["prompt_tokens"], *delta.values()))
        n, first, _ = spent[0]
        tps = PROFILES["qwen36-nvfp4"].prefill_tps(n)
        assert first == pytest.approx(n / tps)
        if engine is plain:
            assert all(hits == 0 and s == pytest.approx(t / tps, rel=0.01) for t, s, hits in spent)
            continue
        whole = (n - 1) // 16 * 16  # the whole blocks before the last token
        assert spent[1][1:] == (pytest.approx((n - whole) / tps), whole)
        longer = spent[2][0]
        assert spent[2][2] == whole and spent[2][1] == pytest.approx((longer - whole) / PROFILES["qwen36-nvfp4"]
                                                                     .prefill_tps(longer))
        assert spent[3][1:] == (pytest.approx(first), 0)  # after the reset


def stream_timed(url: str, body: dict) -> tuple[list[float], dict]:
    """Arrival time of each content chunk, and the usage, of one streamed completion."""
    req = urllib.request.Request(url, json.dumps(body | {"stream": True, "stream_options": {"include_usage": True}})
                                 .encode(), {"Content-Type": "application/json"})
    times, usage = [], {}
    with urllib.request.urlopen(req, timeout=120) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            if chunk["choices"] and chunk["choices"][0].get("text"):
                times.append(time.monotonic())
    return times, usage


@pytest.mark.parametrize(("profile", "depth"), [("qwen36-dflash-n8", 0), ("qwen36-dflash-n8", 8192),
                                                ("qwen36-dflash-n8", 20480),  # ~10K prompt tokens: past the cliff
                                                ("qwen36-dflash-v4", 0),
                                                ("aeon-gemma4-v2", 0), ("qwen36-nvfp4", 8192),
                                                ("diffusiongemma", 0)])
def test_decode_speed_matches_the_profile(sim, profile: str, depth: int) -> None:
    """The engine's own clock (a Spark's seconds) decodes at the profile's tok/s for that depth,
    and the answer's last token comes no sooner than that clock, time-scaled, allows: it waits out
    each step. How close the wall clock comes to the profile on a busy machine is a figure, not a
    behaviour: tests/perf/bench_sweep.py prints the sim's measured decode per config. (Timed from
    chunk arrivals, a delayed first chunk even makes the rest look faster as they catch up.)"""
    p = PROFILES[profile]
    # keep each engine step >= ~3 ms, so timer resolution and a busy machine stay out of the figure
    scale = max(SCALE, 0.003 * p.decode_tps(depth) / p.block)
    engine = sim("--sim-profile", profile, "--speculative-config",
                 '{"method":"ngram","num_speculative_tokens":8}', scale=scale, load_scale=0.001)
    engine.wait_ready(timeout=60)
    tokens = 300 if p.decode_tps(depth) > 50 else 150
    prompt = "".join(["Spark "] * (depth // 2))
    before, sent = metrics(engine.url)[DECODE_S], time.monotonic()
    times, usage = stream_timed(engine.url + "/v1/completions", {
        "model": "tiny", "prompt": prompt, "max_tokens": tokens, "ignore_eos": True})
    assert usage["completion_tokens"] == tokens
    decode_s = metrics(engine.url)[DECODE_S] - before
    expected = p.decode_tps(usage["prompt_tokens"] + tokens // 2)
    assert tokens / decode_s == pytest.approx(expected, rel=0.02), (tokens / decode_s, expected, usage)
    assert times[-1] - sent >= decode_s * scale, (times[-1] - sent, decode_s * scale)


def test_bad_flag_values_are_rejected_like_vllm(tiny_model) -> None:
    import subprocess
    import sys

    for bad in (["--gpu-memory-utilization", "1.5"], ["--max-model-len", "lots"], ["--kv-cache-dtype", "fp3"]):
        proc = subprocess.run([sys.executable, "-m", "sparkctl.sim", "serve", str(tiny_model), *bad],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "vllm serve: error: argument" in proc.stderr, proc.stderr


def test_too_little_memory_fails_at_start(sim) -> None:
    engine = sim("--sim-profile", "qwen36-bf16", "--gpu-memory-utilization", "0.3")
    assert engine.proc.wait(timeout=30) == 1
    assert "No available memory for the cache blocks" in engine.logs()


def test_requests_beyond_the_kv_cache_wait(sim) -> None:
    """At 0.19 of memory the Gemma profile holds ~32K KV tokens: two 16.6K requests take turns."""
    import threading

    engine = sim("--sim-profile", "aeon-gemma4-v2", "--gpu-memory-utilization", "0.19", scale=0.05)
    engine.wait_ready()
    body = {"model": "tiny", "prompt": "Spark " * 16000, "max_tokens": 600, "ignore_eos": True}
    threads = [threading.Thread(target=post, args=(engine.url + "/v1/completions", body)) for _ in range(2)]
    for t in threads:
        t.start()
    seen_waiting = 0.0
    while any(t.is_alive() for t in threads):
        seen_waiting = max(seen_waiting, metrics(engine.url)["vllm:num_requests_waiting"])
        time.sleep(0.01)
    assert seen_waiting == 1


@pytest.mark.parametrize(("fault", "check"), [
    ("empty", lambda body, _: body["choices"][0]["text"] == "" and body["usage"]["completion_tokens"] == 8),
    ("garbage", lambda body, _: not any(c.isalpha() for c in body["choices"][0]["text"])),
    ("slow_health=1.0", lambda _, elapsed: elapsed >= 1.0),
])
def test_injected_faults(sim, fault: str, check) -> None:
    engine = sim("--sim-profile", "aeon-gemma4-v2", scale=0.001, env={"SPARKCTL_SIM_FAULTS": fault})
    engine.wait_ready(timeout=30)
    request = {"model": "tiny", "prompt": "x", "max_tokens": 8, "ignore_eos": True}
    _, body = post(engine.url + "/v1/completions", request)
    start = time.monotonic()
    assert engine.status() == 200
    assert check(body, time.monotonic() - start)


def test_crash_above_concurrency(sim) -> None:
    import threading

    engine = sim("--sim-profile", "aeon-gemma4-latest-broken", "--sim-crash-above", "2", scale=0.01)
    engine.wait_ready()
    # ~2 s of decoding each at this scale, so the three overlap however late a loaded machine starts one
    body = {"model": "tiny", "prompt": "x", "max_tokens": 16000, "ignore_eos": True}

    def call() -> None:
        try:
            post(engine.url + "/v1/completions", body)
        except OSError:
            pass

    threads = [threading.Thread(target=call) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert engine.proc.wait(timeout=10) == 1
    assert "illegal memory access" in engine.logs()
