"""One benchmark run: llama-benchy 0.4.0 (the seeds' tool) as a subprocess (`benchy.py`, which
takes the endpoint's API key from its environment, never from its command line), against an
OpenAI endpoint (the gateway or an engine), with the model's own tokenizer directory, the prompt corpus
the `Method` picks (llama-benchy's own book when it can have it, else ours on loopback: see
`corpus`) and llama-benchy's coherence check unless the method skips it. The engine's /metrics is
read after every test run (`--post-run-cmd`), so each row carries that test's speculative and
diffusion counters. Live progress comes from llama-benchy's event stream. The environment
(`environment.json`), raw JSON, CSV, readings and llama-benchy's output stay in the run folder.
Called by `sparkctl bench`, the switch-over hook and the sweep.
"""

from __future__ import annotations

import csv
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sparkctl.bench import benchy, corpus, environment, metrics, scrape
from sparkctl.bench.profiles import Profile
from sparkctl.errors import SparkctlError


@dataclass(frozen=True)
class Target:
    base_url: str  # an OpenAI base URL, ending in /v1
    model: str  # the name to ask for (an alias, a served name)
    tokenizer: Path  # the downloaded model directory
    metrics_url: str | None = None  # the engine's /metrics
    max_model_len: int | None = None
    api_key: str | None = field(default=None, repr=False)  # the gateway's, when it requires one


@dataclass(frozen=True)
class Row:
    depth: int
    concurrency: int
    pp_tps: float  # prefill tokens/s
    tg_tps: float  # decode tokens/s (summed over concurrent requests)
    ttft_ms: float  # time to first token, end to end (with a prefix-cached profile: the context's own, cold)
    failed: bool = False  # a request of this test failed (an engine that crashed under load)
    acceptance: float | None = None
    acceptance_length: float | None = None
    per_position: tuple[float, ...] = ()
    committed_per_step: float | None = None
    temperature: float | None = None  # the sampling temperature the requests asked for (None: the engine's)
    cached_ttft_ms: float | None = None  # a prompt after a context the prefix cache holds (a `cached` profile)


@dataclass(frozen=True)
class Method:
    """How llama-benchy runs beyond the profile: where its prompts come from (the `bench_corpus`
    setting) and whether it checks the model answers coherently first."""

    corpus: corpus.Setting = "auto"
    skip_coherence: bool = False


@dataclass
class Progress:
    """What the run is doing now, for a live display."""

    depth: int = 0
    concurrency: int = 1
    done: int = 0  # requests finished in this run
    total: int = 0
    tok_s: list[float] = field(default_factory=list)  # per finished request of the current test
    errored: set[tuple[int, int]] = field(default_factory=set)  # (depth, concurrency) of tests with a failed request


def run(target: Target, profile: Profile, *, folder: Path, method: Method | None = None,
        engine: environment.Engine | None = None, on_progress: Callable[[Progress], None] | None = None,
        timeout: float = 6 * 3600) -> list[Row]:
    """Run `profile` against `target`; `engine` describes what serves it, for `environment.json`.
    `on_progress` may raise to stop the run (a cancel): llama-benchy is killed, the error raised."""
    profile, method = profile.within(target.max_model_len), method or Method()
    folder.mkdir(parents=True, exist_ok=True)
    readings = folder / "metrics.jsonl"
    readings.unlink(missing_ok=True)
    if target.metrics_url:
        scrape.main([target.metrics_url, str(readings)])
    home = Path.home()  # llama-benchy caches its book under the home it runs with (it inherits HOME)
    choice = corpus.choose(method.corpus, home=home, reachable=corpus.reachable)
    engine = engine or environment.Engine(target.model, metrics_url=target.metrics_url)
    environment.write(folder, environment.capture(engine, profile=profile, corpus=choice,
                                                  coherence=not method.skip_coherence))
    with corpus.book_args(choice, home=home) as book:
        command = [sys.executable, "-m", "sparkctl.bench.benchy", "--base-url", target.base_url,
                   "--model", target.model, "--tokenizer", str(target.tokenizer), *book, *profile.args(),
                   *(["--skip-coherence"] if method.skip_coherence else []),
                   "--format", "json", "--save-result", str(folder / "llama-benchy.json"), "--emit-progress", "-"]
        if target.metrics_url:
            command += ["--post-run-cmd", shlex.join([sys.executable, "-m", "sparkctl.bench.scrape",
                                                      target.metrics_url, str(readings)])]
        (folder / "command.txt").write_text(shlex.join(command) + "\n")
        progress = _run_benchy(command, folder, profile, on_progress, timeout=timeout, key=target.api_key)
    rows = _rows(json.loads((folder / "llama-benchy.json").read_text()), profile, _readings(readings),
                 errored=progress.errored)
    _write_csv(folder / "rows.csv", rows)
    return rows


def _run_benchy(command: list[str], folder: Path, profile: Profile, on_progress: Callable | None, *,
                timeout: float, key: str | None) -> Progress:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "SPARKCTL_HF_TOKEN", benchy.KEY_ENV)}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # the tokenizer is a local directory
    env |= {benchy.KEY_ENV: key} if key else {}
    progress = Progress(total=sum(c for _, c in profile.tests()) * profile.runs)
    with (folder / "llama-benchy.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if not _follow(line, progress, on_progress):  # llama-benchy's own output: kept with its errors
                    log.write(line)
                    log.flush()
        except BaseException:  # `on_progress` stopped the run (a cancel): llama-benchy ends with it
            proc.kill()
            proc.wait()
            raise
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise SparkctlError(f"llama-benchy ran past {timeout:g} s; see {folder}/llama-benchy.log") from None
    if code != 0 or not (folder / "llama-benchy.json").exists():
        raise SparkctlError(failure(code, (folder / "llama-benchy.log").read_text(), folder=folder))
    return progress


def failure(code: int, log: str, *, folder: Path) -> str:
    """What went wrong in a llama-benchy run, from its output, and what to do about it."""
    lines = log.strip().splitlines()
    coherence = next((line for line in lines if "Coherence test FAILED" in line), None)
    if coherence:
        return (f"llama-benchy's coherence check failed: asked for the capital of France, the model did not answer "
                f"'Paris' ({coherence.strip()[:200]}). A model that answers nonsense is broken: check its image, "
                "quantization and draft. An engine that serves random weights (or the simulated engine) cannot "
                "pass it: run with --skip-coherence (or SPARKCTL_BENCH_SKIP_COHERENCE=1)")
    if any("Error downloading or processing book" in line for line in lines):
        return (f"llama-benchy could not download its default book ({corpus.BOOK_URL}); offline, set "
                f"SPARKCTL_BENCH_CORPUS=loopback (or auto), or put the book at {corpus.cached_book(Path.home())}. "
                f"Its output is in {folder}/llama-benchy.log")
    return f"llama-benchy exited with code {code}: " + " | ".join(lines[-5:])


def _follow(line: str, progress: Progress, on_progress: Callable | None) -> bool:
    """Fold one llama-benchy progress event into `progress`; False if the line is not an event."""
    try:
        event = json.loads(line)
    except ValueError:
        return False
    if not isinstance(event, dict):
        return False
    kind = event.get("type")
    test = (event.get("context_size"), event.get("concurrency"))
    if kind == "request_start" and test != (progress.depth, progress.concurrency):
        progress.depth, progress.concurrency, progress.tok_s = *test, []
    elif kind == "request_end":
        progress.done += 1
        if event.get("error"):
            progress.errored.add((progress.depth, progress.concurrency))
        if event.get("decode_seconds"):
            progress.tok_s.append(event["total_tokens"] / event["decode_seconds"])
    else:
        return True
    if on_progress:
        on_progress(progress)
    return True


def _rows(result: dict, profile: Profile, readings: list[dict[str, float] | None], *,
          errored: set[tuple[int, int]]) -> list[Row]:
    """One row per (depth, concurrency); counters from the readings around its measured runs. A
    test failed when one of its requests did or the engine stopped answering after it; a decode
    rate llama-benchy could not time (every token in one network read) is 0, not a failure. In
    prefix mode a test's context is sent first (its TTFT is the cold one) and its prompt after it
    (the cached TTFT, and the decode)."""
    rows = []
    per_test = profile.runs + 1  # llama-benchy warms up once per test; the post-run command runs each time
    measured = [b for b in result["benchmarks"] if not b.get("is_context_prefill_phase")]
    cold = {(b["context_size"], b["concurrency"]): _mean(b, "e2e_ttft") for b in result["benchmarks"]
            if b.get("is_context_prefill_phase")}
    for index, bench in enumerate(measured):
        start, end = index * per_test + 1, (index + 1) * per_test  # after the warm-up, after the last run
        before, after = (readings[i] if i < len(readings) else None for i in (start, end))
        stats = metrics.between(before, after) if before and after else metrics.EngineStats()
        test = (bench["context_size"], bench["concurrency"])
        tg, ttft = _mean(bench, "tg_throughput"), _mean(bench, "e2e_ttft")
        rows.append(Row(depth=bench["context_size"], concurrency=bench["concurrency"],
                        pp_tps=round(_mean(bench, "pp_throughput"), 2), tg_tps=round(tg, 3),
                        ttft_ms=round(cold.get(test, ttft), 2), cached_ttft_ms=round(ttft, 2) if test in cold else None,
                        failed=test in errored or (bool(readings) and after is None), **asdict(stats),
                        temperature=profile.temperature))
    return rows


def _mean(bench: dict, key: str) -> float:
    return float((bench.get(key) or {}).get("mean") or 0.0)


def _readings(path: Path) -> list[dict[str, float] | None]:
    if not path.exists():
        return []
    return [metrics.parse(text) if text is not None else None
            for text in map(json.loads, path.read_text().splitlines())]


def _write_csv(path: Path, rows: list[Row]) -> None:
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=list(asdict(rows[0])) if rows else ["depth"])
        writer.writeheader()
        for row in rows:
            writer.writerow(asdict(row) | {"per_position": " ".join(map(str, row.per_position))})
