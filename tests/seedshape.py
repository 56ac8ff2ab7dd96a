"""Seed 000's study as stored benchmark runs: the nine Qwen3.6 configs at the seed's 14 depths,
decode and prefill from the simulated engine's calibrated profiles. For report tests and the
report-generation benchmark. Given a folder, each run also gets a run folder holding what the
benchmark leaves there: llama-benchy's raw JSON and an environment.json with seed 000's machine,
engines, dates and settings."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict
from pathlib import Path

from sparkctl.bench.profiles import PROFILES as BENCH_PROFILES
from sparkctl.bench.profiles import SEED_DEPTHS
from sparkctl.bench.runner import Row
from sparkctl.sim.profiles import PROFILES, auto_profile, kv_capacity
from sparkctl.spec.load import load_catalog
from sparkctl.state.store import Store

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("qwen36-nvfp4-stock", "qwen36-nvfp4-eugr", "qwen36-nvfp4-aeon", "qwen36-bf16-stock", "qwen36-bf16-eugr",
           "qwen36-bf16-aeon", "qwen36-dflash", "qwen36-bf16-dflash-n8", "qwen36-bf16-dflash-n1")


# Seed 000's environment, as its Environment table gives it.
HOST = {"hostname": "zgx-5457", "kernel": "6.17.0-1026-nvidia", "os": "Ubuntu 24.04.4 LTS", "arch": "aarch64",
        "gpu": "NVIDIA GB10", "compute_capability": "12.1", "driver": "580.159.03", "cuda": "13.0", "memory_gib": 119.0}
VLLM_VERSIONS = {"vllm/vllm-openai": "0.24.0", "eugr/spark-vllm": "0.23.1rc1.dev899",
                 "ghcr.io/aeon-7/aeon-vllm-ultimate": "0.23.0+aeon.sm121a.dflash"}


def seed_study(store: Store, folder: Path | None = None) -> list[tuple]:
    """(stack, run) for each config, stored in `store`; with `folder`, run folders under it."""
    catalog = load_catalog(ROOT / "stacks", ROOT / "patches")
    entries = []
    for name in CONFIGS:
        stack = catalog.stack(name)
        spec = stack.vllm.speculative
        profile = PROFILES[auto_profile(stack.model.repo, spec.model_dump() if spec else {})]
        rows = [Row(depth=d, concurrency=1, pp_tps=profile.prefill_tps(d), tg_tps=round(profile.benchmarked_tps(d), 3),
                    ttft_ms=round(1000 * (512 + d) / profile.prefill_tps(d), 1),
                    acceptance=profile.acceptance if spec else None,
                    acceptance_length=1 + profile.acceptance * spec.num_speculative_tokens if spec else None)
                for d in SEED_DEPTHS]
        parts = {"image": "sha256:" + name.encode().hex().ljust(64, "0")[:64], "model": "c0ffee" * 6 + "abcd",
                 "draft": "d4af7" * 8 if spec else "", "patches": "5151" * 4 if stack.patches else ""}
        run = store.bench.begin(name, "f" * 16, parts, "seed")
        where = _run_folder(folder / name, stack, rows, profile) if folder else ""
        store.bench.finish(run, folder=where, rows=[asdict(r) for r in rows])
        entries.append((stack, store.bench.run(run)))
    return entries


def _run_folder(folder: Path, stack, rows: list[Row], profile) -> str:
    folder.mkdir(parents=True)
    spec = stack.vllm.speculative
    (folder / "llama-benchy.json").write_text(json.dumps({"version": "0.4.0", "benchmarks": [
        {"context_size": r.depth, "concurrency": r.concurrency, "pp_throughput": {"mean": r.pp_tps},
         "tg_throughput": {"mean": r.tg_tps}, "e2e_ttft": {"mean": r.ttft_ms}} for r in rows]}))
    environment = {
        "date": "2026-07-10T09:00:00Z" if spec else "2026-07-09T21:00:00Z", "host": HOST,
        "engine": {"vllm_version": VLLM_VERSIONS[stack.image.repository], "image": stack.image.ref,
                   "served_model_name": stack.served_name, "flags": shlex.join(_flags(stack))},
        "llama_benchy": "0.4.0", "temperature": None, "corpus": {"kind": "book", "url": None, "note": None},
        "kv_cache_tokens": kv_capacity(profile, stack.resources.gpu_memory_utilization),
        "coherence": "skipped", "profile": {"name": "seed", "args": BENCH_PROFILES["seed"].args()}}
    (folder / "environment.json").write_text(json.dumps(environment))
    return str(folder)


def _flags(stack) -> list[str]:
    """`vllm serve` with seed 000's values as sparkctl renders them (the seed prints no command): the fixed
    serving params, DFlash configs adding theirs."""
    flags = ["vllm", "serve", "/model", "--served-model-name", stack.served_name, "--port", str(stack.port),
             "--max-model-len", "131072", "--gpu-memory-utilization", "0.80", "--no-enable-prefix-caching",
             "--enable-chunked-prefill"]
    if stack.vllm.quantization:
        flags += ["--quantization", stack.vllm.quantization]
    spec = stack.vllm.speculative
    if spec:
        config = {"method": "dflash", "model": "/draft", "num_speculative_tokens": spec.num_speculative_tokens,
                  "draft_sample_method": "probabilistic"}
        flags += ["--attention-backend", "flash_attn", "--mamba-cache-dtype", "float32", "--speculative-config",
                  json.dumps(config)]
    return flags
