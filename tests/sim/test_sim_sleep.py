"""The simulated engine's sleep mode behaves like vLLM 0.32's where sparkctl looks: the dev
endpoints and their shapes, requests across a sleep, and, with a memory scale, real host
memory that follows awake / parked-at-level-1 / parked-at-level-2 (docs/engines.md)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkctl.deploy.memory import available
from tests.conftest import wait_for
from tests.fakes.tinymodel import write_model
from tests.sim.conftest import SimProcess

MB = 2**20
DEV = {"VLLM_SERVER_DEV_MODE": "1"}
COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "ignore_eos": True}


def call(url: str, body: dict | None = None, *, method: str = "POST") -> tuple[int, dict | None]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, None


def gauges(url: str) -> dict[str, float]:
    """`/metrics` samples by name, with the sleep_state label kept (`name:state`)."""
    with urllib.request.urlopen(url + "/metrics") as r:
        text = r.read().decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            sample, value = line.rsplit(" ", 1)
            name = sample.split("{")[0]
            if 'sleep_state="' in sample:
                name += ":" + sample.split('sleep_state="')[1].split('"')[0]
            found[name] = float(value)
    return found


def settles_between(low: float, high: float, read, *, timeout: float = 30) -> bool:
    """`read()` is seen between `low` and `high` within `timeout`: other tests run beside
    this one and move the machine's memory too."""
    deadline = time.monotonic() + timeout
    while not low < read() < high:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def rss_anon(pid: int) -> int:
    return _meminfo_field(Path(f"/proc/{pid}/status"), "RssAnon:")


def _meminfo_field(path: Path, field: str) -> int:
    line = next(line for line in path.read_text().splitlines() if line.startswith(field))
    return int(line.split()[1]) * 1024


@pytest.fixture
def dev_sim(sim) -> Callable[..., SimProcess]:
    """The tiny model's sim with sleep mode and the dev endpoints on, quick to load."""

    def start(*args: str, env: dict | None = None, **kw) -> SimProcess:
        engine = sim("--sim-profile", "aeon-gemma4-v2", "--enable-sleep-mode", *args,
                     env=DEV | (env or {}), **kw)
        engine.wait_ready()
        return engine

    return start


@pytest.fixture
def weighty_sim(tmp_path) -> Iterator:
    """A sim whose model has a real weight file, holding real memory (SPARKCTL_SIM_MEMORY_SCALE
    chosen so that awake it holds `awake` bytes)."""
    started: list[SimProcess] = []

    def start(*, weights: int, awake: int, faults: str = "", scale: float = 0.01,
              sleep_mode: bool = True) -> SimProcess:
        model = write_model(tmp_path / f"model-{len(started)}", weights=False)
        (model / "model.safetensors").write_bytes(b"\x01" * weights)
        memory_scale = awake / (0.5 * _meminfo_field(Path("/proc/meminfo"), "MemTotal:"))
        env = DEV | {"SPARKCTL_SIM_MEMORY_SCALE": repr(memory_scale), "SPARKCTL_SIM_FAULTS": faults}
        flags = ["--enable-sleep-mode"] if sleep_mode else []
        started.append(SimProcess(model, "--sim-profile", "aeon-gemma4-v2", "--gpu-memory-utilization", "0.5",
                                  *flags, scale=scale, load_scale=0.001, env=env))
        started[-1].wait_ready()
        return started[-1]

    yield start
    for p in started:
        p.stop()


def test_dev_endpoints_are_404_without_dev_mode(sim) -> None:
    engine = sim("--sim-profile", "aeon-gemma4-v2", "--enable-sleep-mode", env={"VLLM_SERVER_DEV_MODE": "0"})
    engine.wait_ready()
    for path in ("/sleep?level=1", "/wake_up", "/collective_rpc", "/reset_prefix_cache"):
        assert call(engine.url + path, {})[0] == 404, path
    assert call(engine.url + "/is_sleeping", method="GET")[0] == 404
    assert call(engine.url + "/v1/completions", COMPLETION)[0] == 200


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_wake_round_trip(dev_sim, level: int) -> None:
    engine = dev_sim()
    url = engine.url
    assert call(url + "/is_sleeping", method="GET") == (200, {"is_sleeping": False})
    assert call(url + f"/sleep?level={level}") == (200, {"status": "sleeping", "level": level})
    assert call(url + "/is_sleeping", method="GET") == (200, {"is_sleeping": True})
    state = gauges(url)
    assert (state["vllm:engine_sleep_state:awake"], state["vllm:engine_sleep_state:weights_offloaded"],
            state["vllm:engine_sleep_state:discard_all"]) == (0, level == 1, level == 2)
    assert engine.status("/health") == 200  # vLLM's /health only checks that the engine lives
    status, body = call(url + "/v1/completions", COMPLETION)
    assert status == 503 and body["error"]["type"] == "ServiceUnavailableError"

    assert call(url + "/wake_up") == (200, {"status": "awake", "tags": None})
    assert call(url + "/collective_rpc", {"method": "reload_weights"}) == (200, {"results": [None]})
    assert call(url + "/reset_prefix_cache") == (200, {"success": True})
    assert call(url + "/is_sleeping", method="GET") == (200, {"is_sleeping": False})
    status, body = call(url + "/v1/completions", COMPLETION)
    assert status == 200 and body["choices"][0]["text"].strip()
    assert gauges(url)["vllm:engine_sleep_state:awake"] == 1


def test_level_2_wake_serves_empty_weights_until_reload(dev_sim) -> None:
    """A level-2 wake maps the weights' memory again but only reload_weights fills it; until
    then the model's output is noise (here: no letters)."""
    url = dev_sim().url
    call(url + "/sleep?level=2")
    call(url + "/wake_up")
    _, body = call(url + "/v1/completions", COMPLETION)
    assert not any(c.isalpha() for c in body["choices"][0]["text"])
    call(url + "/collective_rpc", {"method": "reload_weights"})
    _, body = call(url + "/v1/completions", COMPLETION)
    assert any(c.isalpha() for c in body["choices"][0]["text"])


def test_partial_wake_by_tags_and_bad_calls(dev_sim) -> None:
    url = dev_sim().url
    call(url + "/sleep?level=1")
    assert call(url + "/wake_up?tags=weights") == (200, {"status": "sleeping", "tags": ["weights"]})
    assert call(url + "/v1/completions", COMPLETION)[0] == 503
    assert call(url + "/wake_up?tags=kv_cache") == (200, {"status": "awake", "tags": ["kv_cache"]})
    assert call(url + "/v1/completions", COMPLETION)[0] == 200
    status, body = call(url + "/sleep?level=3")
    assert status == 400 and body["error"]["param"] == "level"
    assert call(url + "/collective_rpc", {"args": []})[0] == 400
    assert call(url + "/collective_rpc", {"method": "no_such_method"})[0] == 500


@pytest.mark.parametrize(("mode", "finish"), [("abort", "abort"), ("wait", "length")])
def test_running_request_across_a_sleep(dev_sim, mode: str, finish: str) -> None:
    """`abort` (vLLM's default) ends a running request with finish_reason "abort"; `wait`
    lets it finish before the engine parks."""
    engine = dev_sim(scale=0.3, load_scale=0.001)  # 270 tok/s: 600 tokens take ~2.2 s
    request = COMPLETION | {"max_tokens": 600}
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(call(engine.url + "/v1/completions", request)[1]))
    worker.start()
    wait_for(lambda: gauges(engine.url)["vllm:num_requests_running"] >= 1, what="the request running")
    assert call(engine.url + f"/sleep?level=1&mode={mode}")[0] == 200
    worker.join(timeout=60)
    assert result["choices"][0]["finish_reason"] == finish
    assert (result["usage"]["completion_tokens"] < 600) == (mode == "abort")


def test_requests_queue_while_asleep_with_the_vllm_fault(dev_sim) -> None:
    """Real vLLM queues a request that arrives while asleep until /wake_up (the sim's default
    is a 503); `queue_while_asleep` does what vLLM does."""
    engine = dev_sim(env={"SPARKCTL_SIM_FAULTS": "queue_while_asleep"})
    call(engine.url + "/sleep?level=1")
    result: list = []
    worker = threading.Thread(target=lambda: result.append(call(engine.url + "/v1/completions", COMPLETION)))
    worker.start()
    wait_for(lambda: gauges(engine.url)["vllm:num_requests_waiting"] >= 1, what="the request queued")
    assert not result
    call(engine.url + "/wake_up")
    worker.join(timeout=60)
    assert result[0][0] == 200 and result[0][1]["usage"]["completion_tokens"] == 4


def test_memory_follows_awake_and_parked_levels(weighty_sim) -> None:
    """With a memory scale the sim holds real memory: awake = weights + KV cache, parked at
    level 1 = the weights' host copy, at level 2 = nothing. Exact by the sim's own count and
    by its RssAnon; roughly (other processes move it too) by MemAvailable."""
    weights, awake = 128 * MB, 400 * MB
    before = available()
    engine = weighty_sim(weights=weights, awake=awake)
    pid = engine.proc.pid

    def held() -> float:
        return gauges(engine.url)["sparkctl_sim_memory_bytes"]

    assert held() == pytest.approx(awake, abs=MB)
    assert settles_between(0.5 * awake, awake + 400 * MB, lambda: before - available())  # + the interpreter

    awake_avail, awake_rss = available(), rss_anon(pid)
    call(engine.url + "/sleep?level=1")
    assert held() == weights
    assert rss_anon(pid) == pytest.approx(awake_rss - (awake - weights), abs=24 * MB)
    assert settles_between(0.4 * (awake - weights), awake - weights + 300 * MB, lambda: available() - awake_avail)

    call(engine.url + "/wake_up")
    assert held() == pytest.approx(awake, abs=MB)
    awake_avail, awake_rss = available(), rss_anon(pid)
    call(engine.url + "/sleep?level=2")
    assert held() == 0
    assert rss_anon(pid) == pytest.approx(awake_rss - awake, abs=24 * MB)
    assert settles_between(0.4 * awake, awake + 300 * MB, lambda: available() - awake_avail)


def test_sleep_without_enable_sleep_mode_frees_nothing(weighty_sim) -> None:
    """vLLM 0.32 answers /sleep without --enable-sleep-mode too (200, is_sleeping true), but its
    allocator holds nothing to release: the memory stays."""
    engine = weighty_sim(weights=16 * MB, awake=64 * MB, sleep_mode=False)
    assert call(engine.url + "/sleep?level=2") == (200, {"status": "sleeping", "level": 2})
    assert call(engine.url + "/is_sleeping", method="GET") == (200, {"is_sleeping": True})
    assert gauges(engine.url)["sparkctl_sim_memory_bytes"] == pytest.approx(64 * MB, abs=MB)


def test_wake_keeps_backup_raises_the_wake_peak(weighty_sim) -> None:
    """vLLM #50011 on unified memory: the level-1 wake keeps the weights' host copy while the
    KV cache comes back, so the wake peaks a whole weights' size higher. The rise is spread
    over the wake (~1.4 s at time scale 1), so a poller sees it; the sim's own RssAnon is
    polled here because other processes on the machine move MemAvailable too."""
    weights, awake = 96 * MB, 320 * MB
    peaks = {}
    for faults in ("", "wake_keeps_backup"):
        engine = weighty_sim(weights=weights, awake=awake, faults=faults, scale=1.0)
        call(engine.url + "/sleep?level=1")
        waking = threading.Thread(target=call, args=(engine.url + "/wake_up",))
        peak = rss_anon(engine.proc.pid)
        waking.start()
        while waking.is_alive():
            peak = max(peak, rss_anon(engine.proc.pid))
            time.sleep(0.005)
        peaks[faults] = peak - rss_anon(engine.proc.pid)  # above the awake level
        engine.stop()
    assert peaks[""] < weights * 0.6 + 24 * MB  # the weights come back before the KV cache
    assert peaks["wake_keeps_backup"] > peaks[""] + weights / 2
