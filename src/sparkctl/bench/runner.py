"""One benchmark run: llama-benchy 0.4.0 (the seeds' tool) as a subprocess, against an OpenAI
endpoint (the gateway or an engine), with the model's own tokenizer directory and the loopback
corpus. The engine's /metrics is read after every test run (`--post-run-cmd`), so each row
carries that test's speculative and diffusion counters. Live progress comes from llama-benchy's
event stream. The raw JSON, CSV and readings stay in the run folder. Called by `sparkctl bench`,
the switch-over hook and the sweep.
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

from sparkctl.bench import corpus, metrics, scrape
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
    ttft_ms: float  # time to first token, end to end
    failed: bool = False  # a request of this test failed (an engine that crashed under load)
    acceptance: float | None = None
    acceptance_length: float | None = None
    per_position: tuple[float, ...] = ()
    committed_per_step: float | None = None


@dataclass
class Progress:
    """What the run is doing now, for a live display."""

    depth: int = 0
    concurrency: int = 1
    done: int = 0  # requests finished in this run
    total: int = 0
    tok_s: list[float] = field(default_factory=list)  # per finished request of the current test
    errored: set[tuple[int, int]] = field(default_factory=set)  # (depth, concurrency) of tests with a failed request


def run(target: Target, profile: Profile, *, folder: Path, on_progress: Callable[[Progress], None] | None = None,
        timeout: float = 6 * 3600) -> list[Row]:
    profile = profile.within(target.max_model_len)
    folder.mkdir(parents=True, exist_ok=True)
    readings = folder / "metrics.jsonl"
    readings.unlink(missing_ok=True)
    if target.metrics_url:
        scrape.main([target.metrics_url, str(readings)])
    with corpus.served() as book:
        command = [sys.executable, "-m", "llama_benchy", "--base-url", target.base_url, "--model", target.model,
                   "--tokenizer", str(target.tokenizer), "--book-url", book, *profile.args(), "--skip-coherence",
                   "--format", "json", "--save-result", str(folder / "llama-benchy.json"), "--emit-progress", "-"]
        if target.api_key:
            command += ["--api-key", target.api_key]
        if target.metrics_url:
            command += ["--post-run-cmd", shlex.join([sys.executable, "-m", "sparkctl.bench.scrape",
                                                      target.metrics_url, str(readings)])]
        shown = shlex.join(command).replace(target.api_key, "**********") if target.api_key else shlex.join(command)
        (folder / "command.txt").write_text(shown + "\n")
        progress = _run_benchy(command, folder, profile, on_progress, timeout)
    rows = _rows(json.loads((folder / "llama-benchy.json").read_text()), profile, _readings(readings),
                 errored=progress.errored)
    _write_csv(folder / "rows.csv", rows)
    return rows


def _run_benchy(command: list[str], folder: Path, profile: Profile, on_progress: Callable | None,
                timeout: float) -> Progress:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "SPARKCTL_HF_TOKEN")}
    env |= {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # the tokenizer is a local directory
    progress = Progress(total=sum(c for _, c in profile.tests()) * profile.runs)
    with (folder / "llama-benchy.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        assert proc.stdout is not None
        for line in proc.stdout:
            _follow(line, progress, on_progress)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise SparkctlError(f"llama-benchy ran past {timeout:g} s; see {folder}/llama-benchy.log") from None
    if code != 0 or not (folder / "llama-benchy.json").exists():
        tail = (folder / "llama-benchy.log").read_text().strip().splitlines()[-5:]
        raise SparkctlError(f"llama-benchy exited with code {code}: " + " | ".join(tail))
    return progress


def _follow(line: str, progress: Progress, on_progress: Callable | None) -> None:
    """Fold one llama-benchy progress event into `progress`."""
    try:
        event = json.loads(line)
    except ValueError:
        return
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
        return
    if on_progress:
        on_progress(progress)


def _rows(result: dict, profile: Profile, readings: list[dict[str, float] | None], *,
          errored: set[tuple[int, int]]) -> list[Row]:
    """One row per (depth, concurrency); counters from the readings around its measured runs. A
    test failed when one of its requests did or the engine stopped answering after it; a decode
    rate llama-benchy could not time (every token in one network read) is 0, not a failure."""
    rows = []
    per_test = profile.runs + 1  # llama-benchy warms up once per test; the post-run command runs each time
    measured = [b for b in result["benchmarks"] if not b.get("is_context_prefill_phase")]
    for index, bench in enumerate(measured):
        start, end = index * per_test + 1, (index + 1) * per_test  # after the warm-up, after the last run
        before, after = (readings[i] if i < len(readings) else None for i in (start, end))
        stats = metrics.between(before, after) if before and after else metrics.EngineStats()
        tg = _mean(bench, "tg_throughput")
        rows.append(Row(depth=bench["context_size"], concurrency=bench["concurrency"],
                        pp_tps=round(_mean(bench, "pp_throughput"), 2), tg_tps=round(tg, 3),
                        ttft_ms=round(_mean(bench, "e2e_ttft"), 2),
                        failed=(bench["context_size"], bench["concurrency"]) in errored
                        or (bool(readings) and after is None), **asdict(stats)))
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
