"""Seed 000's study as stored benchmark runs: the nine Qwen3.6 configs at the seed's 14 depths,
decode and prefill from the simulated engine's calibrated profiles. For report tests and the
report-generation benchmark."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from sparkctl.bench.profiles import SEED_DEPTHS
from sparkctl.bench.runner import Row
from sparkctl.sim.profiles import PROFILES, auto_profile
from sparkctl.spec.load import load_catalog
from sparkctl.state.store import Store

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ("qwen36-nvfp4-stock", "qwen36-nvfp4-eugr", "qwen36-nvfp4-aeon", "qwen36-bf16-stock", "qwen36-bf16-eugr",
           "qwen36-bf16-aeon", "qwen36-dflash", "qwen36-bf16-dflash-n8", "qwen36-bf16-dflash-n1")


def seed_study(store: Store) -> list[tuple]:
    """(stack, run) for each config, stored in `store`."""
    catalog = load_catalog(ROOT / "stacks", ROOT / "patches")
    entries = []
    for name in CONFIGS:
        stack = catalog.stack(name)
        spec = stack.vllm.speculative
        profile = PROFILES[auto_profile(stack.model.repo, spec.model_dump() if spec else {})]
        rows = [Row(depth=d, concurrency=1, pp_tps=profile.prefill_tps(d), tg_tps=round(profile.decode_tps(d), 3),
                    ttft_ms=round(1000 * (512 + d) / profile.prefill_tps(d), 1),
                    acceptance=profile.acceptance if spec else None,
                    acceptance_length=1 + profile.acceptance * spec.num_speculative_tokens if spec else None)
                for d in SEED_DEPTHS]
        parts = {"image": "sha256:" + name.encode().hex().ljust(64, "0")[:64], "model": "c0ffee" * 6 + "abcd",
                 "draft": "d4af7" * 8 if spec else "", "patches": "5151" * 4 if stack.patches else ""}
        run = store.bench.begin(name, "f" * 16, parts, "seed")
        store.bench.finish(run, folder="", rows=[asdict(r) for r in rows])
        entries.append((stack, store.bench.run(run)))
    return entries
