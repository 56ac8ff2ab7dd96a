"""report.md: the headline table (decode per config and depth), TTFT and acceptance, speedups
over the no-spec twin with the crossover depth, decode efficiency with its assumptions, each
config's fingerprint, the hardware, and any blacklisted digests with their reasons."""

from __future__ import annotations

from sparkctl.report.analysis import crossover


def render(data: list[dict], *, title: str, label: str, hardware: str, bandwidth_gbs: float,
           images: list[str], bans: dict[str, str]) -> str:
    single = [r for r in data if r["concurrency"] == 1]
    configs = list(dict.fromkeys(r["config"] for r in data))
    depths = sorted({r["depth"] for r in single})
    out = [f"# {title}", "", f"_{label}_", "", f"Hardware: {hardware}", ""]
    out += ["## Decode tok/s by context depth (single stream)", "", *_grid(single, configs, depths, "decode_tps",
                                                                             "{:.1f}"), ""]
    out += ["## Time to first token (ms)", "", *_grid(single, configs, depths, "ttft_ms", "{:.0f}"), ""]
    accepted = [r for r in single if r["acceptance"] is not None]
    if accepted:
        out += ["## Speculative acceptance (rate / mean acceptance length)", "",
                *_grid(accepted, list(dict.fromkeys(r["config"] for r in accepted)), depths, "acceptance", "{:.2f}",
                       extra="acceptance_length"), ""]
    committed = [r for r in single if r["committed_per_step"] is not None]
    if committed:
        out += ["## Diffusion: tokens committed per denoising step", "",
                *_grid(committed, list(dict.fromkeys(r["config"] for r in committed)), depths, "committed_per_step",
                       "{:.1f}"), ""]
    out += _speedups(single, configs, depths)
    out += ["## Decode efficiency against the bandwidth bound", "",
            f"Assumed: memory bandwidth {bandwidth_gbs:g} GB/s (setting SPARKCTL_MEMORY_BANDWIDTH_GBS); bytes read "
            "per token from each stack's `resources.read_per_token_gb` (estimates). Efficiency = decode tok/s x GB "
            "per token / bandwidth; above 1.0 means more than one token per weight read (speculation, diffusion "
            "blocks).", "", *_grid([r for r in single if r["efficiency"] is not None], configs, depths,
                                    "efficiency", "{:.2f}"), ""]
    crashed = sorted({(r["config"], r["concurrency"]) for r in data if r["failed"]})
    if crashed:
        out += ["## Failures under load", "", *[f"- {c}: requests failed at concurrency {n}" for c, n in crashed], ""]
    out += ["## Fingerprints", "", "| config | run | image digest | model commit | draft commit | patch set |",
            "|---|---|---|---|---|---|"]
    for config in configs:
        r = next(r for r in data if r["config"] == config)
        out.append(f"| {config} | {r['run']} | `{_short(r['image'])}` | `{_short(r['model_commit'])}` | "
                   f"`{_short(r['draft_commit'])}` | `{_short(r['patches'])}` |")
    out += ["", "## Graphs", "", *[f"![{name}]({name})" for name in images], ""]
    if bans:
        out += ["## Blacklisted images", "", *[f"- `{ref}`: {reason}" for ref, reason in bans.items()], ""]
    out += ["Data: dataset.csv, dataset.json (one row per config x depth x concurrency).", ""]
    return "\n".join(out)


def _grid(rows: list[dict], configs: list[str], depths: list[int], key: str, fmt: str, *,
          extra: str | None = None) -> list[str]:
    lines = ["| config | " + " | ".join(f"{d}" for d in depths) + " |", "|---|" + "---|" * len(depths)]
    for config in configs:
        cells = []
        for depth in depths:
            r = next((r for r in rows if r["config"] == config and r["depth"] == depth), None)
            value = r.get(key) if r else None
            text = fmt.format(value) if value is not None else ""
            if extra and r and r.get(extra) is not None:
                text += f" / {r[extra]:.2f}"
            cells.append(text)
        if any(cells):
            lines.append(f"| {config} | " + " | ".join(cells) + " |")
    return lines


def _speedups(single: list[dict], configs: list[str], depths: list[int]) -> list[str]:
    paired = [c for c in configs if any(r["config"] == c and r["speedup_vs_twin"] is not None for r in single)]
    if not paired:
        return []
    out = ["## Speculation against its no-spec twin (decode speedup)", "",
           *_grid(single, paired, depths, "speedup_vs_twin", "{:.2f}x"), ""]
    for config in paired:
        rows = [r for r in single if r["config"] == config and r["speedup_vs_twin"] is not None]
        found = crossover({r["depth"]: r["speedup_vs_twin"] for r in rows})
        twin = rows[0]["twin"]
        best = max(rows, key=lambda r: r["speedup_vs_twin"])
        where = (f"faster through depth {found[0]}, slower from {found[1]} (crossover)" if found else
                 "no crossover in the measured depths")
        out.append(f"- {config} vs {twin}: up to {best['speedup_vs_twin']:.2f}x (depth {best['depth']}); {where}")
    return [*out, ""]


def _short(value: str | None) -> str:
    if not value:
        return "-"
    return value.removeprefix("sha256:")[:12]
