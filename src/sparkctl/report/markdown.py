"""comparison.md, in seed 000's layout: the headline (`headline.py`), the Environment and
Configs tested tables (`environment.py`), the folder's contents and the commands that reproduce
it, decode, prefill and TTFT by depth, startup, the Quality section (`quality.py`: each config's
accuracy, where measured), the Caveats (`caveats.py`); then speculative acceptance,
diffusion steps, speedups over the no-spec twin with the crossover depth, decode efficiency with
its assumptions, failures under load, each config's fingerprint, the graphs and any blacklisted
digests with their reasons. Pure: `report.write` writes the text."""

from __future__ import annotations

from sparkctl.bench.profiles import PROFILES
from sparkctl.report import environment
from sparkctl.report.analysis import Config, crossover
from sparkctl.report.caveats import caveats
from sparkctl.report.environment import Entry
from sparkctl.report.headline import headline
from sparkctl.report.quality import section as quality_section
from sparkctl.state.quality import QualityRun


def render(entries: list[Entry], data: list[dict], configs: list[Config], *, title: str, label: str,
           bandwidth_gbs: float, images: list[str], results: list[str], bans: dict[str, str],
           quality: dict[str, QualityRun] | None = None) -> str:
    single = [r for r in data if r["concurrency"] == 1]
    names = list(dict.fromkeys(r["config"] for r in data))
    depths = sorted({r["depth"] for r in single})
    rows = environment.table(entries, bandwidth_gbs=bandwidth_gbs)
    out = [f"# {title}", "", *([f"_{label}_", ""] if label else []), _intro(data, configs, dict(rows)), "",
           f"**Headline:** {headline(configs)}", ""]
    out += ["## Environment", "", "| | |", "|---|---|", *[f"| {key} | {_cell(value)} |" for key, value in rows], ""]
    out += _configs(entries)
    out += _contents(data, images, results)
    out += _reproduce(entries)
    out += ["## Decode tok/s by context depth (single stream)", "",
            *_grid(single, names, depths, "decode_tps", "{:.1f}"), ""]
    out += ["## Prefill tok/s by context depth", "", *_grid(single, names, depths, "prefill_tps", "{:.0f}"), ""]
    out += ["## Time to first token (ms)", "", *_grid(single, names, depths, "ttft_ms", "{:.0f}"), ""]
    out += _cached(data)
    out += _aggregate(data, names)
    out += _startup(entries)
    out += quality_section(quality or {}, {e.stack.name: e.run.fingerprint for e in entries})
    out += ["## Caveats", "", *[f"- {line}" for line in caveats(entries)], ""]
    out += _analysis(data, single, names, depths, bandwidth_gbs=bandwidth_gbs)
    out += ["## Graphs", "", *[f"![{name}](graphs/{name})" for name in images], ""]
    if bans:
        out += ["## Blacklisted images", "", *[f"- `{ref}`: {reason}" for ref, reason in bans.items()], ""]
    return "\n".join(out)


def _aggregate(data: list[dict], names: list[str]) -> list[str]:
    """Seed 003's aggregate throughput: decode summed over the streams, at each concurrency above 1."""
    loaded = [r for r in data if r["concurrency"] > 1]
    if not loaded:
        return []
    levels = sorted({r["concurrency"] for r in loaded})
    out = ["## Aggregate throughput (decode tok/s summed over the streams)", "",
           "| config | depth | " + " | ".join(f"{n} streams" for n in levels) + " |",
           "|---|---|" + "---|" * len(levels)]
    for config, depth in dict.fromkeys((r["config"], r["depth"]) for r in loaded if r["config"] in names):
        cells = {r["concurrency"]: f"{r['decode_tps']:.1f}" + (" (failed)" if r["failed"] else "")
                 for r in loaded if (r["config"], r["depth"]) == (config, depth)}
        out.append(f"| {config} | {depth} | " + " | ".join(cells.get(n, "-") for n in levels) + " |")
    return [*out, ""]


def _cached(data: list[dict]) -> list[str]:
    """The time to first token with the context in the engine's prefix cache, beside the context's own
    (runs of a prefix-cached profile; seed 000 has none: prefix caching hung with its draft)."""
    cached = [r for r in data if r.get("cached_ttft_ms") is not None]
    if not cached:
        return []
    out = ["## Time to first token with the context cached (ms)", "",
           "| config | depth | streams | the context, cold | the prompt after it, cached | cached / cold |",
           "|---|---|---|---|---|---|"]
    for r in cached:
        ratio = f"{r['cached_ttft_ms'] / r['ttft_ms']:.2f}" if r["ttft_ms"] else "-"
        out.append(f"| {r['config']} | {r['depth']} | {r['concurrency']} | {r['ttft_ms']:.0f} | "
                   f"{r['cached_ttft_ms']:.0f} | {ratio} |")
    return [*out, ""]


def _startup(entries: list[Entry]) -> list[str]:
    out = ["## Startup and memory per stack", "",
           "| config | fetch (resolve, pull, download, patch) | start to serving | memory share | KV-cache tokens |",
           "|---|---|---|---|---|"]
    out += [f"| {e.stack.name} | " + " | ".join(environment.startup(e)) + " |" for e in entries]
    return [*out, ""]


def _configs(entries: list[Entry]) -> list[str]:
    common = environment.common_flags(entries)
    out = ["## Configs tested", "", "| config | checkpoint | engine | speculation | flags | KV cache |",
           "|---|---|---|---|---|---|"]
    for e in entries:
        cells = (e.stack.name, environment.checkpoint(e.stack) or "-", environment.engine(e),
                 environment.speculation(e.stack), environment.own_flags(e, common), environment.kv_headroom(e))
        out.append("| " + " | ".join(map(_cell, cells)) + " |")
    return [*out, ""]


def _contents(data: list[dict], images: list[str], results: list[str]) -> list[str]:
    configs = len({r["config"] for r in data})
    depths = len({r["depth"] for r in data})
    out = ["## Contents", "", "- comparison.md — headline, environment, tables, caveats, analysis",
           f"- dataset.csv / dataset.json — every datapoint ({configs} configs × {depths} depths)",
           f"- graphs/ — {', '.join(images)}"]
    if results:
        out.append(f"- results/ — raw llama-benchy JSON ({', '.join(results)})")
    return [*out, ""]


def _intro(data: list[dict], configs: list[Config], rows: dict[str, str]) -> str:
    """Seed 000's opening line on method: what was measured, on what, with which tool."""
    streams = "Single-stream" if {r["concurrency"] for r in data} == {1} else "Single-stream and concurrent"
    return (f"{streams} inference benchmarks of {rows['Target model']} on {rows['GPU']}, comparing "
            f"{len(configs)} configs (engines x checkpoints x speculation). Measured with {rows['Benchmark tool']}, "
            "every figure from the runs this report names; the commands under Reproduce measure them again.")


def _reproduce(entries: list[Entry]) -> list[str]:
    """The sparkctl commands that measure these configs again (one sweep when the runs share a
    profile and depths, else a run each) and write this report from the stored runs."""
    shapes = {(e.run.profile, _depths(e)) for e in entries}
    if len(shapes) == 1:
        profile, depths = shapes.pop()
        measure = [f"sparkctl bench sweep {' '.join(e.stack.name for e in entries)} --profile {profile}"
                   f"{_depths_option(profile, depths)}"]
    else:
        measure = [f"sparkctl up {e.stack.name} && sparkctl bench run {e.stack.name} --profile {e.run.profile}"
                   f"{_depths_option(e.run.profile, _depths(e))}" for e in entries]
    report = "sparkctl bench report " + " ".join(str(e.run.id) for e in entries)
    return ["## Reproduce", "", "```", *measure, report + "   # this report, from the stored runs", "```", ""]


def _depths(entry: Entry) -> tuple[int, ...]:
    return tuple(sorted({r["depth"] for r in entry.run.rows}))


def _depths_option(profile: str, depths: tuple[int, ...]) -> str:
    named = PROFILES.get(profile)
    return "" if named and named.depths == depths else f" --depths {','.join(map(str, depths))}"


def _analysis(data: list[dict], single: list[dict], names: list[str], depths: list[int], *,
              bandwidth_gbs: float) -> list[str]:
    out = []
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
    out += _speedups(single, names, depths)
    out += ["## Decode efficiency against the bandwidth bound", "",
            f"Assumed: memory bandwidth {bandwidth_gbs:g} GB/s (setting SPARKCTL_MEMORY_BANDWIDTH_GBS); bytes read "
            "per token from each stack's `resources.read_per_token_gb` (estimates). Efficiency = decode tok/s x GB "
            "per token / bandwidth; above 1.0 means more than one token per weight read (speculation, diffusion "
            "blocks).", "", *_grid([r for r in single if r["efficiency"] is not None], names, depths,
                                    "efficiency", "{:.2f}"), ""]
    crashed = sorted({(r["config"], r["concurrency"]) for r in data if r["failed"]})
    if crashed:
        out += ["## Failures under load", "", *[f"- {c}: requests failed at concurrency {n}" for c, n in crashed], ""]
    out += ["## Fingerprints", "", "| config | run | image digest | model commit | draft commit | patch set |",
            "|---|---|---|---|---|---|"]
    for config in names:
        r = next(r for r in data if r["config"] == config)
        out.append(f"| {config} | {r['run']} | `{_short(r['image'])}` | `{_short(r['model_commit'])}` | "
                   f"`{_short(r['draft_commit'])}` | `{_short(r['patches'])}` |")
    return [*out, ""]


def _cell(value: str) -> str:
    """A table cell: pipes escaped, so a flag's JSON or a note cannot break the table."""
    return value.replace("|", "\\|").replace("\n", " ")


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
