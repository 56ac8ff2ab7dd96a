"""The benchmark's pure parts: engine-counter deltas, profiles within a context window, the gate,
the prompt corpus a run picks, the sampling temperature and the environment a run records."""

from __future__ import annotations

import json
import platform
import sys
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from sparkctl.bench import corpus, environment, metrics, runner
from sparkctl.bench import stack as bench_stack
from sparkctl.bench.gate import judge
from sparkctl.bench.profiles import PROFILES
from sparkctl.container import Inspected
from sparkctl.spec.load import load_catalog
from sparkctl.spec.models import Expectations
from sparkctl.state.bench import BenchRun

ROOT = Path(__file__).resolve().parents[2]

BEFORE = """# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{model_name="m"} 10
vllm:spec_decode_num_draft_tokens_total{model_name="m"} 80
vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 40
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="0"} 9
vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 7
"""
AFTER = BEFORE.replace(" 10\n", " 110\n").replace(" 80\n", " 880\n").replace(" 40\n", " 440\n") \
    .replace('"0"} 9', '"0"} 99').replace('"1"} 7', '"1"} 57')


def test_counter_deltas_give_acceptance_length_and_per_position() -> None:
    stats = metrics.between(metrics.parse(BEFORE), metrics.parse(AFTER))
    assert stats.acceptance == pytest.approx(0.5) and stats.acceptance_length == pytest.approx(5.0)
    assert stats.per_position == (0.9, 0.5) and stats.committed_per_step is None


def test_diffusion_committed_tokens_per_step() -> None:
    before = metrics.parse("vllm:diffusion_num_committed_tokens 100\nvllm:diffusion_num_denoising_steps 10\n")
    after = metrics.parse("vllm:diffusion_num_committed_tokens 420\nvllm:diffusion_num_denoising_steps 50\n")
    assert metrics.between(before, after).committed_per_step == 8.0


def test_profiles_keep_the_depths_that_fit_the_window() -> None:
    assert PROFILES["seed"].within(32768).depths[-1] == 24576
    assert PROFILES["quick"].within(None).depths == (0, 4096, 16384)
    assert PROFILES["quick"].within(600).depths == (0,)


def test_a_test_fails_on_a_failed_request_not_on_a_rate_it_could_not_time() -> None:
    """llama-benchy reports decode 0 when every token came in one network read (a fast engine):
    that is an untimed rate; a request that ended with an error is the failure."""
    progress = runner.Progress()
    for line in ('{"type": "request_start", "context_size": 0, "concurrency": 1}',
                 '{"type": "request_end", "total_tokens": 128, "decode_seconds": 0, "error": ""}',
                 '{"type": "request_start", "context_size": 0, "concurrency": 16}',
                 '{"type": "request_end", "total_tokens": 0, "decode_seconds": 0, "error": "Connection reset"}'):
        runner._follow(line, progress, None)
    tests = [{"context_size": 0, "concurrency": c, "tg_throughput": {"mean": tg}} for c, tg in ((1, 0.0), (16, 9.0))]
    rows = runner._rows({"benchmarks": tests}, PROFILES["quick"], [], errored=progress.errored)
    assert [(r.concurrency, r.failed) for r in rows] == [(1, False), (16, True)]


def run(rows: list[dict], id_: int = 2) -> BenchRun:
    return BenchRun(id_, "s", "f", {"image": "sha256:" + "a" * 64}, "quick", "", 0, 1, None, None, rows)


def row(depth: int = 0, tg: float = 20.0, acceptance: float | None = 0.6, concurrency: int = 1, failed=False) -> dict:
    return {"depth": depth, "concurrency": concurrency, "tg_tps": tg, "acceptance": acceptance, "failed": failed}


@pytest.mark.parametrize(("rows", "expect", "baseline", "reason"), [
    ([row()], Expectations(min_decode_tps=18), None, None),
    ([row(tg=10)], Expectations(min_decode_tps=18), None, "decode 10.0 tok/s < 18 floor at depth 0"),
    ([row(tg=0.0)], Expectations(min_decode_tps=18), None, None),  # untimed, not slow
    ([row(acceptance=0.1)], Expectations(min_acceptance=0.4), None, "acceptance 0.10 < 0.40 floor"),
    ([row(tg=15)], Expectations(max_drop=0.1), run([row(tg=20)], 1), "25% under known-good run 1"),
    ([row(tg=19)], Expectations(max_drop=0.1), run([row(tg=20)], 1), None),
    ([row(), row(concurrency=16, failed=True)], Expectations(min_concurrency=16), None,
     "requests failed at concurrency 16"),
    ([row(), row(concurrency=32, failed=True)], Expectations(min_concurrency=16), None, None),
])
def test_the_gate(rows, expect, baseline, reason) -> None:
    verdict = judge(run(rows), expect, baseline=baseline)
    assert verdict.passed is (reason is None)
    if reason:
        assert reason in verdict.describe() and verdict.describe().endswith("(run 2)")


# The prompt corpus: which one a run uses, decided without the network wherever possible.

def _never(url: str) -> bool:
    raise AssertionError(f"probed {url}: this choice needs no network")


@pytest.mark.parametrize(("setting", "cached", "online", "kind", "note"), [
    ("loopback", True, _never, "loopback", "bench_corpus=loopback"),
    ("book", False, _never, "book", "bench_corpus=book"),
    ("auto", True, _never, "book", "from its cache"),
    ("auto", False, lambda url: True, "book", "downloaded"),
    ("auto", False, lambda url: False, "loopback", "offline (www.gutenberg.org unreachable"),
])
def test_the_corpus_choice(tmp_path, setting, cached, online, kind, note) -> None:
    if cached:
        corpus.cached_book(tmp_path).parent.mkdir(parents=True)
        corpus.cached_book(tmp_path).write_text("It was in the spring of the year 1894.")
    choice = corpus.choose(setting, home=tmp_path, reachable=online)
    assert choice.kind == kind and note in choice.note
    assert choice.url == (corpus.BOOK_URL if kind == "book" else None)


def test_the_book_is_llama_benchys_default_and_its_cache_file(tmp_path, monkeypatch) -> None:
    """`auto` finds the book where llama-benchy 0.4.0 itself caches it: its corpus loads our
    cached file (downloading anything would fail the test) and its default URL is ours."""
    from llama_benchy import corpus as benchy_corpus
    from llama_benchy.config import BenchmarkConfig

    monkeypatch.setattr(sys, "argv", ["llama-benchy", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"])
    assert BenchmarkConfig.from_args().book_url == corpus.BOOK_URL
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(benchy_corpus.requests, "get", _never)
    corpus.cached_book(tmp_path).parent.mkdir(parents=True)
    corpus.cached_book(tmp_path).write_text("Holmes")
    loader = benchy_corpus.TokenizedCorpus.__new__(benchy_corpus.TokenizedCorpus)
    loader.book_url, loader.tokenizer = corpus.BOOK_URL, SimpleNamespace(encode=lambda text, **_: list(text))
    assert loader._load_data() == list("Holmes")


def test_the_loopback_corpus_leaves_no_copy_in_llama_benchys_cache(tmp_path) -> None:
    loopback = corpus.choose("loopback", home=tmp_path, reachable=_never)
    with corpus.book_args(loopback, home=tmp_path) as args:
        flag, url = args
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read()
        copy = corpus.cache_file(url, tmp_path)  # what llama-benchy does with a book it downloads
        copy.parent.mkdir(parents=True)
        copy.write_bytes(text)
    assert flag == "--book-url" and url.startswith("http://127.0.0.1:") and len(text.split()) > 100_000
    assert not copy.exists()
    with corpus.book_args(corpus.choose("book", home=tmp_path, reachable=_never), home=tmp_path) as args:
        assert args == []  # llama-benchy's own default


def test_a_temperature_reaches_llama_benchy_as_a_float_in_the_request_body() -> None:
    from llama_benchy.config import BenchmarkConfig

    sampled = replace(PROFILES["quick"], temperature=1)
    args = sampled.args()
    assert args[-2:] == ["--extra-body", "temperature=1.0"] and "--extra-body" not in PROFILES["quick"].args()
    assert BenchmarkConfig._parse_extra_body([args[-1]]) == {"temperature": 1.0}
    tests = [{"context_size": 0, "concurrency": 1, "tg_throughput": {"mean": 9.0}}]
    assert runner._rows({"benchmarks": tests}, sampled, [], errored=set())[0].temperature == 1


# The environment a run records.

SMI_QUERY = "NVIDIA GB10, 580.95.05, 12.1\n"
SMI_BANNER = "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0     |\n"
FILES = {"/etc/os-release": 'NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 24.04.3 LTS"\n',
         "/proc/meminfo": "MemTotal:       124906240 kB\nMemFree:  1 kB\n"}
METRICS = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="20148"} 1.0\n'
ENGINE = environment.Engine("qwen", url="http://127.0.0.1:8101", metrics_url="http://127.0.0.1:8101/metrics",
                            image="ghcr.io/aeon-7/x:1@sha256:" + "b" * 64, flags="serve /model --port 8101")
NOW = datetime(2026, 5, 4, 12, 30, tzinfo=UTC)


def probe(commands: dict, files: dict, answers: dict) -> environment.Probe:
    return environment.Probe(command=lambda argv: commands.get(" ".join(argv)), read=lambda p: files.get(str(p)),
                             fetch=answers.get, now=lambda: NOW)


def test_the_environment_of_a_run() -> None:
    commands = {" ".join(environment.GPU_QUERY): SMI_QUERY, "nvidia-smi": SMI_BANNER}
    answers = {"http://127.0.0.1:8101/version": '{"version": "0.23.1rc1"}', ENGINE.metrics_url: METRICS}
    choice = corpus.Choice("loopback", None, "offline: loopback corpus")
    env = environment.capture(ENGINE, profile=replace(PROFILES["quick"], temperature=1.0), corpus=choice,
                              coherence=False, probe=probe(commands, FILES, answers))
    assert env["date"] == "2026-05-04T12:30:00+00:00"
    assert {k: env["host"][k] for k in ("os", "gpu", "compute_capability", "driver", "cuda", "memory_gib")} == {
        "os": "Ubuntu 24.04.3 LTS", "gpu": "NVIDIA GB10", "compute_capability": "12.1", "driver": "580.95.05",
        "cuda": "13.0", "memory_gib": 119.1}
    assert env["host"]["kernel"] == platform.release() and env["host"]["arch"] == platform.machine()
    assert env["engine"] == {"vllm_version": "0.23.1rc1", "image": ENGINE.image, "flags": "serve /model --port 8101",
                             "served_model_name": "qwen"}
    assert env["llama_benchy"] == "0.4.0" and env["temperature"] == 1.0 and env["coherence"] == "skipped"
    assert env["corpus"] == {"kind": "loopback", "url": None, "note": "offline: loopback corpus"}
    assert env["kv_cache_tokens"] == 20148 * 16
    assert env["profile"]["name"] == "quick" and env["profile"]["args"][-1] == "temperature=1.0"
    json.dumps(env)  # environment.json


def test_missing_tools_and_a_silent_engine_give_unknown() -> None:
    bare = environment.Engine("tiny", url="http://127.0.0.1:9")
    env = environment.capture(bare, profile=PROFILES["quick"], corpus=corpus.choose("book", home=Path("/x"),
                              reachable=_never), coherence=True, probe=probe({}, {}, {}))
    assert {k: env["host"][k] for k in ("os", "gpu", "driver", "cuda", "memory_gib")} == {
        "os": "unknown", "gpu": "unknown", "driver": "unknown", "cuda": "unknown", "memory_gib": None}
    assert env["engine"] == {"vllm_version": "unknown", "image": "unknown", "flags": "unknown",
                             "served_model_name": "tiny"}
    assert env["temperature"] is None and env["kv_cache_tokens"] is None and env["coherence"] == "checked"
    assert environment.capture(bare, profile=PROFILES["quick"], corpus=corpus.choose("book", home=Path("/x"),
                               reachable=_never), coherence=True,
                               probe=probe({}, {}, {"http://127.0.0.1:9/version": "<html>"}))["engine"][
        "vllm_version"] == "unknown"


def test_the_real_probe_never_raises() -> None:
    assert environment.run_command(["/nonexistent/nvidia-smi"]) is None
    assert environment.read_text(Path("/nonexistent/os-release")) is None
    assert environment.http_get("http://127.0.0.1:9/version") is None  # the discard port: nothing listens


CATALOG = load_catalog(ROOT / "stacks", ROOT / "patches")


class FakeDocker:
    def __init__(self, config: dict | None) -> None:
        self.config = config

    def containers(self, stack: str) -> list:
        return [SimpleNamespace(id="c1", running=True)] if self.config is not None else []

    def inspect(self, _: str) -> Inspected:
        return Inspected.from_inspect({"Config": self.config})


def test_the_engine_a_run_measures() -> None:
    stack = CATALOG.stack("qwen36-dflash")
    digest = "sha256:" + "c" * 64
    running = bench_stack.engine_facts(stack, {"image": digest}, FakeDocker({"Entrypoint": ["vllm"],
                                                                            "Cmd": ["serve", "/model", "--x", "a b"]}))
    assert running.flags == "vllm serve /model --x 'a b'" and running.image == f"{stack.image.ref}@{digest}"
    assert running.url == stack.url and running.served_model_name == stack.served_name
    rendered = bench_stack.engine_facts(stack, {}, FakeDocker(None))
    assert rendered.flags is not None and "--speculative-config" in rendered.flags
    assert rendered.image == stack.image.ref


def test_why_llama_benchy_failed_says_what_to_do(tmp_path) -> None:
    incoherent = "Warmup complete.\n\nRunning coherence test...\nCoherence test FAILED: Expected 'Paris'. Got: x\n"
    assert "--skip-coherence" in runner.failure(1, incoherent, folder=tmp_path)
    offline = "Error downloading or processing book: HTTPSConnectionPool(host='www.gutenberg.org')\n"
    assert "SPARKCTL_BENCH_CORPUS=loopback" in runner.failure(1, offline, folder=tmp_path)
    assert runner.failure(2, "a\nb\n", folder=tmp_path) == "llama-benchy exited with code 2: a | b"


def test_a_prefix_cached_run_reads_the_cold_and_the_cached_ttft_of_each_test() -> None:
    """llama-benchy's prefix mode records each test twice: its context sent alone (cold), then a
    prompt after it (cached); a test at depth 0 has no context to cache."""
    cached = PROFILES["cached"]
    assert cached.args()[-1] == "--enable-prefix-caching" and "--enable-prefix-caching" not in PROFILES["seed"].args()
    tests = [{"context_size": 4096, "concurrency": 1, "is_context_prefill_phase": True, "e2e_ttft": {"mean": 2300.0}},
             {"context_size": 4096, "concurrency": 1, "e2e_ttft": {"mean": 310.0}, "tg_throughput": {"mean": 20.0}},
             {"context_size": 0, "concurrency": 1, "e2e_ttft": {"mean": 290.0}, "tg_throughput": {"mean": 21.0}}]
    deep, shallow = runner._rows({"benchmarks": tests}, cached, [], errored=set())
    assert (deep.ttft_ms, deep.cached_ttft_ms, deep.tg_tps) == (2300.0, 310.0, 20.0)
    assert (shallow.ttft_ms, shallow.cached_ttft_ms) == (290.0, None)


def test_the_cached_profile_is_refused_on_a_stack_that_caches_nothing(workspace) -> None:
    from sparkctl.errors import SparkctlError
    from sparkctl.phase import Phase
    from sparkctl.settings import Settings
    from sparkctl.state.store import Store

    settings = Settings()
    store = Store(settings.store_path)
    stack = load_catalog(workspace / "stacks", workspace / "patches").stack("qwen36-dflash")  # seed 000: off
    store.deployments.advance(store.deployments.begin(stack.name), Phase.RUNNING)
    with pytest.raises(SparkctlError, match="prefix caching off .* seed 000 kept it off, as it hung"):
        bench_stack.benchmark(stack, settings=settings, store=store, profile=PROFILES["cached"])
    assert not store.bench.runs(stack.name)  # refused before a run was begun
