"""Benchmarks on a real dockerd with sim engines: `bench run` stores a gated run with its
fingerprint, engine counters and environment (the vLLM version the engine reports, its command
line, the corpus, the temperature), `auto` takes llama-benchy's own book when its cache holds it,
and `bench sweep` deploys configs one at a time and writes a comparison report with seed 000's
shape (NVFP4 ~2x BF16, DFlash n=8 up to ~3x, then the cliff)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sparkctl.bench import corpus
from sparkctl.sim.engine import VERSION
from sparkctl.state.store import Store
from tests.conftest import image_policy, ours, wait_for

SCALED = "SPARKCTL_SIM_TIME_SCALE=0.05,SPARKCTL_SIM_LOAD_SCALE=0.002"  # decode 20x, loading near-instant


@pytest.fixture
def scaled(world, monkeypatch):
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", SCALED)
    return world


def test_bench_run_stores_a_gated_run_with_engine_counters(scaled, cli, monkeypatch, tmp_path) -> None:
    """The daemon runs the benchmark and stores it (this process, the CLI's, cannot write a run
    here), and its notes and rows stream back."""
    from sparkctl.state.bench import BenchRuns

    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # llama-benchy's cache: the run leaves nothing there
    assert cli("up", "qwen36-dflash")[0] == 0
    monkeypatch.setattr(BenchRuns, "begin", lambda *_: pytest.fail("the CLI's process wrote a benchmark run"))
    code, out, err = cli("bench", "run", "qwen36-dflash", "--profile", "quick", "--depths", "0,4096",
                         "--temperature", "1.0")
    assert code == 0, err
    said = " ".join(out.split())
    assert "qwen36-dflash: measuring depth 4096 at concurrency 1" in said and "qwen36-dflash — run 1" in said
    assert re.search(r"run 1 \(quick\) of qwen36-dflash: pass; raw files in \S+/bench/1", said), said
    [run] = Store(scaled / "state" / "sparkctl.db").bench.runs("qwen36-dflash")
    assert run.verdict == "pass" and run.parts["draft"] and run.parts["patches"]
    assert [(r["depth"], r["temperature"]) for r in run.rows] == [(0, 1.0), (4096, 1.0)]
    env = json.loads((Path(run.folder) / "environment.json").read_text())
    assert env["engine"]["vllm_version"] == VERSION and env["engine"]["image"].endswith(run.parts["image"])
    assert "--speculative-config" in env["engine"]["flags"] and env["engine"]["flags"].startswith("vllm serve")
    assert env["temperature"] == 1.0 and env["corpus"]["kind"] == "loopback"  # pinned for tests (conftest)
    command = (Path(run.folder) / "command.txt").read_text()
    assert "--extra-body temperature=1.0" in command and "--book-url http://127.0.0.1:" in command
    assert (tmp_path / "home" / ".cache" / "llama-benchy").is_dir()  # llama-benchy cached our corpus there...
    assert not list((tmp_path / "home" / ".cache" / "llama-benchy").iterdir())  # ...and the run removed it
    assert all(0.5 < r["acceptance"] < 0.8 and r["acceptance_length"] > 4 and len(r["per_position"]) == 8
               for r in run.rows)  # the sim's DFlash profile accepts ~65% of drafted tokens
    [pin] = [p for ref, p in image_policy(scaled).pins.items() if "aeon-vllm-ultimate" in ref]
    assert pin.known_good and pin.digest == run.parts["image"] and f"run {run.id}" in pin.provenance


def benchmarking(cli, monkeypatch) -> subprocess.Popen:
    """`bench run` of a stack up, in a process of its own, once its first test is under way."""
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", "SPARKCTL_SIM_TIME_SCALE=0.25,SPARKCTL_SIM_LOAD_SCALE=0.002")
    assert cli("up", "qwen36-nvfp4-stock")[0] == 0
    bench = subprocess.Popen([sys.executable, "-m", "sparkctl", "bench", "run", "qwen36-nvfp4-stock", "--profile",
                              "concurrency"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    said: list[str] = []
    threading.Thread(target=lambda: [said.append(line) for line in bench.stdout], daemon=True).start()
    wait_for(lambda: any("measuring depth 0 at concurrency 1" in line for line in said), timeout=60,
             what="the benchmark under way")
    return bench


def test_ctrl_c_of_a_bench_run_stops_llama_benchy_in_the_daemon(world, cli, monkeypatch) -> None:
    """A benchmark runs in the daemon, and a Ctrl-C cancels it there as it does an `up`:
    llama-benchy ends at its next request, and the run is stored as stopped."""
    bench = benchmarking(cli, monkeypatch)
    bench.send_signal(signal.SIGINT)
    assert bench.wait(timeout=60) == 130
    err = bench.stderr.read()
    assert "bench qwen36-nvfp4-stock: cancelled: it stopped: stopped: llama-benchy was stopped" in err, err
    [run] = Store(world / "state" / "sparkctl.db").bench.runs("qwen36-nvfp4-stock")
    assert "llama-benchy was stopped" in run.error and not run.rows
    assert not [cmd for cmd in map(_command_line, Path("/proc").glob("[0-9]*")) if run.folder in cmd]  # it ended


def test_a_down_while_a_bench_run_measures_stops_it(world, cli, monkeypatch) -> None:
    """A `down` (and so the daemon's stop) ends a benchmark at its next request rather than wait
    in the stack's turn for the whole run."""
    bench = benchmarking(cli, monkeypatch)
    code, _, err = cli("down", "qwen36-nvfp4-stock")
    assert code == 0, err
    assert bench.wait(timeout=60) == 1 and "llama-benchy was stopped" in bench.stderr.read()


def _command_line(process: Path) -> str:
    try:
        return (process / "cmdline").read_text(errors="replace")
    except OSError:  # ended meanwhile
        return ""


def test_auto_takes_llama_benchys_cached_book(scaled, cli, monkeypatch, tmp_path) -> None:
    """The one test of `auto`: llama-benchy's cache (under a private HOME) holds its book, so the run
    uses it, decided and read without any network, and records that it did."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SPARKCTL_BENCH_CORPUS", "auto")
    book = corpus.cached_book(tmp_path / "home")
    book.parent.mkdir(parents=True)
    book.write_text(corpus.text(words=20_000))
    assert cli("up", "qwen36-nvfp4-stock")[0] == 0
    code, _, err = cli("bench", "run", "qwen36-nvfp4-stock", "--profile", "quick", "--depths", "0")
    assert code == 0, err
    [run] = Store(scaled / "state" / "sparkctl.db").bench.runs("qwen36-nvfp4-stock")
    env = json.loads((Path(run.folder) / "environment.json").read_text())
    assert env["corpus"] == {"kind": "book", "url": corpus.BOOK_URL,
                             "note": f"llama-benchy's default book, from its cache {book}"}
    assert "--book-url" not in (Path(run.folder) / "command.txt").read_text()
    assert f"Loading text from cache: {book}" in (Path(run.folder) / "llama-benchy.log").read_text()


def test_sweep_writes_a_comparison_report_with_the_seed_shape(scaled, cli, engine, tmp_path, monkeypatch) -> None:
    """The shape, not the figures: which config decodes faster than which, the crossover and the
    headline built from the measured runs. How close the ratios come to the seed's (NVFP4 2x BF16,
    DFlash up to ~3x) is a figure of the machine's load too, and tests/perf/bench_sweep.py measures it."""
    # Decode 10x rather than 20x: the per-token CPU cost of a faster stream takes a larger share of
    # its time on a loaded machine, and would blur the configs' order.
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", "SPARKCTL_SIM_TIME_SCALE=0.1,SPARKCTL_SIM_LOAD_SCALE=0.002")
    code, out, err = cli("bench", "sweep", "qwen36-nvfp4-stock", "qwen36-nvfp4-aeon", "qwen36-bf16-stock",
                         "qwen36-dflash", "--profile", "quick", "--depths", "0,8192,12288", "--out",
                         str(tmp_path / "report"), "--label", "measured on simulated engines")
    assert code == 0, err
    data = json.loads((tmp_path / "report" / "dataset.json").read_text())
    decode = {(r["config"], r["depth"]): r["decode_tps"] for r in data}
    assert len(data) == 4 * 3
    stock, aeon, bf16 = (decode[(config, 0)] for config in ("qwen36-nvfp4-stock", "qwen36-nvfp4-aeon",
                                                            "qwen36-bf16-stock"))
    assert bf16 < stock and abs(stock - aeon) < (stock - bf16) / 2  # two engines alike, far apart from BF16
    assert decode[("qwen36-dflash", 0)] > decode[("qwen36-nvfp4-aeon", 0)]  # ~3x, over its no-spec twin
    text = (tmp_path / "report" / "comparison.md").read_text()
    assert "faster through depth 8192, slower from 12288 (crossover)" in text
    headline = next(line for line in text.splitlines() if line.startswith("**Headline:**"))
    quant = re.search(r"NVFP4 = ([\d.]+)× decode over BF16", headline)
    assert quant and float(quant[1]) > 1, headline
    assert "qwen36-dflash (dflash n=8 on NVFP4) hits " in headline and ", then falls below it from " in headline
    assert f"(vLLM {VERSION})" in text and "| Benchmark tool | llama-benchy 0.4.0 |" in text  # environment.json
    assert {p.name for p in (tmp_path / "report" / "results").iterdir()} == \
        {f"{r['config']}.json" for r in data}  # each run's raw llama-benchy JSON
    assert not [c for c in ours(engine) if c["State"] == "running"]  # one at a time, then down
