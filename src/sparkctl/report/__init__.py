"""The comparison report of benchmark runs, laid out as seed 000's study folder: comparison.md,
graphs/ (PNGs), results/ (each run's raw llama-benchy JSON as `<config>.json`) and
dataset.csv/json (one row per config x depth x concurrency).

`write` takes (stack spec, run) pairs and each stack's quality run (`quality.py`), reads each
run folder's environment.json (the machine, engine and settings it ran with; absent for older
runs), computes the twins, speedups, crossover and efficiency (`analysis.py`) and the headline
(`headline.py`), and writes everything into one folder. Called by `sparkctl bench report`, the sweep and `make demo`.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from pathlib import Path

from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase
from sparkctl.report import drift, environment, markdown, quality
from sparkctl.report.analysis import Config, crossover, efficiency, speedups, twin
from sparkctl.report.environment import Entry
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.state.bench import BenchRun
from sparkctl.state.quality import QualityRun
from sparkctl.state.store import Store

REPORT = "comparison.md"
COLUMNS = ("config", "run", "depth", "concurrency", "temperature", "prefill_tps", "decode_tps", "ttft_ms",
           "cached_ttft_ms", "acceptance", "acceptance_length", "committed_per_step", "speedup_vs_twin", "twin",
           "efficiency", "failed", "image", "model_commit", "draft_commit", "patches")


def compare(entries: list[tuple[Stack, BenchRun]], settings: Settings, store: Store, *, label: str = "",
            folder: Path | None = None) -> Path:
    """The report of these runs (`sparkctl bench report` and sweep, the dashboard's Compare), with
    the bans of the images they used and the startup of the deployments that served them (from
    `store`), in `folder` (else a new one in the state dir's reports/); returns comparison.md's path."""
    blacklist = store.images.policy().blacklist
    if not entries:
        raise SparkctlError("nothing to report: no benchmark runs (`sparkctl bench run STACK`)")
    repos = {stack.image.repository for stack, _ in entries}
    bans = {ref: ban.reason for ref, ban in blacklist.items()
            if ref.startswith("sha256:") or ref.rsplit(":", 1)[0] in repos}
    folder = folder or settings.state_dir / "reports" / time.strftime("%Y%m%d-%H%M%S")
    startups = {stack.name: found for stack, run in entries if (found := _startup(store, run)) is not None}
    checked = {stack.name: found for stack, run in entries if (found := quality.chosen(store, run)) is not None}
    return write(entries, folder, bandwidth_gbs=settings.memory_bandwidth_gbs, label=label, bans=bans,
                 title="sparkctl benchmark report: " + ", ".join(s.name for s, _ in entries), startups=startups,
                 quality=checked, drift=drift.section(store, [s.name for s, _ in entries]))


def _startup(store: Store, run: BenchRun) -> tuple[float, float] | None:
    """(fetch, start to serving) in seconds, from the phases of the deployment that served `run`:
    the last one of its fingerprint that reached running before the run began."""
    for made in store.deployments.history(run.stack):  # newest first
        if made.fingerprint != run.fingerprint or made.started > run.started:
            continue
        at = {phase: t for phase, t, _ in store.deployments.transitions(made.id)}
        if Phase.STARTING in at and Phase.RUNNING in at:
            return at[Phase.STARTING] - made.started, at[Phase.RUNNING] - at[Phase.STARTING]
    return None


def write(entries: list[tuple[Stack, BenchRun]], folder: Path, *, bandwidth_gbs: float, title: str, label: str,
          bans: dict[str, str] | None = None, startups: dict[str, tuple[float, float]] | None = None,
          quality: dict[str, QualityRun] | None = None, drift: list[str] | None = None) -> Path:
    """Write the report into `folder` (created); returns the path of comparison.md. `startups`:
    each stack's (fetch, start to serving) seconds, where known; `quality`: each stack's quality
    run; `drift`: the greedy drift section."""
    folder.mkdir(parents=True, exist_ok=True)
    studied = list({stack.name: Entry(stack, run, _environment(run), (startups or {}).get(stack.name))
                    for stack, run in entries}.values())
    configs = [_config(e) for e in studied]
    data = _dataset(configs, {e.stack.name: e.run for e in studied}, bandwidth_gbs=bandwidth_gbs)
    _write_dataset(data, folder)
    (folder / "graphs").mkdir(exist_ok=True)
    seeds = {e.stack.name: seed for e in studied if (seed := e.stack.expectations.seed_decode_tps)}
    images = _draw(data, folder / "graphs", subtitle=label, seeds=seeds)
    results = _copy_results(studied, folder / "results")
    text = markdown.render(studied, data, configs, title=title, label=label, bandwidth_gbs=bandwidth_gbs,
                           images=images, results=results, bans=bans or {}, quality=quality or {})
    (folder / REPORT).write_text("\n".join([text, *(drift or [])]))
    return folder / REPORT


def _config(entry: Entry) -> Config:
    stack, run = entry.stack, entry.run
    decode = {r["depth"]: r["tg_tps"] for r in run.rows if r["concurrency"] == 1}
    return Config(stack.name, environment.model(stack), stack.image.repository, stack.extends,
                  bool(stack.vllm and stack.vllm.speculative), stack.resources.read_per_token_gb, decode,
                  engine=stack.image.ref, speculation=environment.speculation(stack, detail=False),
                  checkpoint=environment.checkpoint(stack))


def _environment(run: BenchRun) -> dict:
    """The run folder's environment.json, or {} (an older run, a moved folder, a torn file)."""
    if not run.folder:
        return {}
    try:
        found = json.loads((Path(run.folder) / "environment.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _copy_results(entries: list[Entry], results: Path) -> list[str]:
    """Each run's raw llama-benchy JSON as results/<config>.json; runs whose folder is gone are left out."""
    copied = []
    for stale in results.glob("*.json"):  # a report written here before, of other configs
        stale.unlink()
    for e in entries:
        raw = Path(e.run.folder) / "llama-benchy.json" if e.run.folder else None
        if raw is not None and raw.is_file():
            results.mkdir(exist_ok=True)
            shutil.copyfile(raw, results / f"{e.stack.name}.json")
            copied.append(f"{e.stack.name}.json")
    return copied


def _dataset(configs: list[Config], runs: dict[str, BenchRun], *, bandwidth_gbs: float) -> list[dict]:
    """One row per config x depth (x concurrency): the measurements, the speedup over the config's
    no-spec twin, the decode efficiency, and the fingerprint parts."""
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
                "cached_ttft_ms": r.get("cached_ttft_ms"),
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


def _write_dataset(data: list[dict], folder: Path) -> None:
    (folder / "dataset.json").write_text(json.dumps(data, indent=1) + "\n")
    with (folder / "dataset.csv").open("w", newline="") as out:
        writer = csv.DictWriter(out, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(data)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _draw(data: list[dict], folder: Path, *, subtitle: str, seeds: dict[str, float]) -> list[str]:
    """The graphs (PNG, matplotlib without a display): decode, TTFT and prefill against context
    depth (one line per config; decode with each speculative config's crossover marked and each
    seed's figure as a reference line), and grouped bars of decode per config at a few depths."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    single = [r for r in data if r["concurrency"] == 1]
    configs = list(dict.fromkeys(r["config"] for r in single))
    written = []
    for key, label, name in (("decode_tps", "decode (tokens/s)", "decode_vs_depth.png"),
                             ("ttft_ms", "time to first token (ms)", "ttft_vs_depth.png"),
                             ("prefill_tps", "prefill (tokens/s)", "prefill_vs_depth.png")):
        fig = _by_depth(plt, single, configs, key, label, subtitle, seeds if key == "decode_tps" else {})
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        written.append(name)
    written.append(_bars(plt, single, configs, folder, subtitle))
    return written


def _by_depth(plt, single: list[dict], configs: list[str], key: str, label: str, subtitle: str,  # noqa: ANN001, ANN202
              seeds: dict[str, float]):
    """One metric against context depth, a line per config; with a single depth measured, a bar
    per config (a line through one point would draw an axis around nothing). A seed's figure is
    a dashed line in its config's colour; a crossover, a marked point at the first slower depth."""
    fig, ax = plt.subplots(figsize=(9, 5))
    depths = sorted({r["depth"] for r in single})
    colours = {c: f"C{i % 10}" for i, c in enumerate(configs)}
    if len(depths) == 1:
        values = [next((r[key] or 0 for r in single if r["config"] == c), 0) for c in configs]
        ax.bar(range(len(configs)), values, color=[colours[c] for c in configs])
        for i, config in enumerate(configs):
            if config in seeds:
                ax.hlines(seeds[config], i - 0.4, i + 0.4, colors="black", linestyles="dashed")
                ax.annotate(f"seed {seeds[config]:g}", (i, seeds[config]), textcoords="offset points",
                            xytext=(0, 3), ha="center", fontsize=7)
        ax.set_xticks(range(len(configs)), configs, rotation=30, ha="right", fontsize=8)
        ax.set(ylabel=label, title=f"{label} at context depth {depths[0]} tokens\n{subtitle}")
    else:
        for config in configs:
            rows = sorted((r for r in single if r["config"] == config), key=lambda r: r["depth"])
            ax.plot([r["depth"] for r in rows], [r[key] for r in rows], marker="o", markersize=3, label=config,
                    color=colours[config])
            if key == "decode_tps" and (found := crossover({r["depth"]: r["speedup_vs_twin"] for r in rows
                                                             if r["speedup_vs_twin"] is not None})):
                slower = next(r for r in rows if r["depth"] == found[1])
                ax.plot([slower["depth"]], [slower[key]], marker="X", markersize=10, color=colours[config])
                ax.annotate(f"crossover at depth {found[1]}", (slower["depth"], slower[key]), ha="right",
                            textcoords="offset points", xytext=(-8, 8), fontsize=7, color=colours[config])
        for seed in sorted(set(seeds.values())):  # one line a figure, naming the configs it is theirs
            which = [c for c in configs if seeds.get(c) == seed]
            ax.axhline(seed, color="grey", linestyle="dashed", linewidth=1,
                       label=f"the seed's {seed:g}: {', '.join(which)}")
        ax.set_xscale("symlog", linthresh=512)
        ax.set_xlim(-64, depths[-1] * 1.2)  # the reference lines span the axes, not the data: keep it to the depths
        ax.set(xlabel="context depth (tokens)", ylabel=label, title=f"{label} vs context depth\n{subtitle}")
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _bars(plt, single: list[dict], configs: list[str], folder: Path, subtitle: str) -> str:
    depths = sorted({r["depth"] for r in single})
    shown = [d for d in (0, 8192, 32768) if d in depths] or depths[:3]
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(max(8, len(configs) * 1.1), 5))
    for i, depth in enumerate(shown):
        values = [next((r["decode_tps"] for r in single if r["config"] == c and r["depth"] == depth), 0)
                  for c in configs]
        ax.bar([x + i * width for x in range(len(configs))], values, width, label=f"depth {depth}")
    ax.set_xticks([x + width * (len(shown) - 1) / 2 for x in range(len(configs))], configs, rotation=30,
                  ha="right", fontsize=8)
    ax.set(ylabel="decode (tokens/s)", title=f"decode per config, by context depth (tokens)\n{subtitle}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "decode_by_config.png", dpi=110)
    plt.close(fig)
    return "decode_by_config.png"
