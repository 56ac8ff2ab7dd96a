"""The report's dataset: one row per config x depth (x concurrency) with the measurements,
the speedup over the config's no-spec twin, the decode efficiency, and the fingerprint parts;
written as dataset.csv and dataset.json."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from sparkctl.report.analysis import Config, efficiency, speedups, twin
from sparkctl.state.bench import BenchRun

COLUMNS = ("config", "run", "depth", "concurrency", "temperature", "prefill_tps", "decode_tps", "ttft_ms",
           "acceptance", "acceptance_length", "committed_per_step", "speedup_vs_twin", "twin", "efficiency", "failed",
           "image", "model_commit", "draft_commit", "patches")


def rows(configs: list[Config], runs: dict[str, BenchRun], *, bandwidth_gbs: float) -> list[dict]:
    out = []
    for config in configs:
        base = twin(config, configs)
        gain = speedups(config, base) if base else {}
        run = runs[config.name]
        for r in run.rows:
            single = r["concurrency"] == 1
            out.append({
                "config": config.name, "run": run.id, "depth": r["depth"], "concurrency": r["concurrency"],
                "temperature": r.get("temperature"),  # None: the run set none, so the engine's default
                "prefill_tps": r["pp_tps"], "decode_tps": r["tg_tps"], "ttft_ms": r["ttft_ms"],
                "acceptance": r.get("acceptance"), "acceptance_length": r.get("acceptance_length"),
                "committed_per_step": r.get("committed_per_step"),
                "speedup_vs_twin": _round(gain.get(r["depth"])) if single else None,
                "twin": base.name if base else None,
                "efficiency": _round(efficiency(r["tg_tps"], config.read_per_token_gb, bandwidth_gbs)) if single
                else None,
                "failed": bool(r.get("failed")), "image": run.parts.get("image"),
                "model_commit": run.parts.get("model"), "draft_commit": run.parts.get("draft") or None,
                "patches": run.parts.get("patches") or None})
    return out


def write(data: list[dict], folder: Path) -> None:
    (folder / "dataset.json").write_text(json.dumps(data, indent=1) + "\n")
    with (folder / "dataset.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(data)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
