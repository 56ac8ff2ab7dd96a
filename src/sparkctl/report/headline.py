"""The report's headline, in the spirit of seed 000's ("engines are identical on decode; NVFP4 =
2x decode over BF16 (8.9 vs 4.5 tok/s); DFlash n=8 hits 21-26 tok/s (up to 3x) through 8k, then
collapses below baseline past ~8k"), computed from the configs' decode by depth: how far engines
spread on decode with the same checkpoint, what one checkpoint of a model decodes against another
on the same engine, each speculative config's speedup over its no-spec twin through its crossover,
and which config decodes fastest when the configs serve different models (or nothing else
applies). A part appears only when the data holds what it needs. Pure; `markdown.py` calls it.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations
from statistics import mean

from sparkctl.report.analysis import Config, crossover, speedups, twin


def headline(configs: list[Config]) -> str:
    """One paragraph, clauses joined by semicolons; says so when there is nothing to compare."""
    measured = [c for c in configs if _decode(c)]
    if not measured:
        return "no decode was measured, so there is nothing to compare."
    parts = [*_engines(measured), *_checkpoints(measured), *_speculation(measured)]
    if not parts or len({c.family for c in measured}) > 1:
        parts.append(_fastest(measured))
    parts.append(_untwinned(measured))
    return "; ".join(p for p in parts if p) + "."


def depth_label(depth: int) -> str:
    """Depths as the seed writes them: 8192 -> 8k, 500 -> 500."""
    return f"{depth // 1024}k" if depth and depth % 1024 == 0 else str(depth)


def _engines(configs: list[Config]) -> list[str]:
    """No-spec configs of one checkpoint (the same model repo) on different engines."""
    groups: dict[str, dict[str, Config]] = defaultdict(dict)
    for c in configs:
        if not c.speculative:
            groups[c.model].setdefault(c.engine or c.image, c)
    found = []
    for model, by_engine in groups.items():
        depth = _shared_depth(by_engine.values())
        if len(by_engine) < 2 or depth is None:
            continue
        values = [c.decode[depth] for c in by_engine.values()]
        label = next(iter(by_engine.values())).checkpoint or model
        found.append((max(values) / min(values) - 1, f"{label} on {len(values)} engines: "
                      f"{_range(values)} tok/s at depth {depth_label(depth)}"))
    if not found:
        return []
    widest = max(spread for spread, _ in found)
    return [f"engines decode within {widest:.1%} of each other ({'; '.join(text for _, text in found)})"]


def _checkpoints(configs: list[Config]) -> list[str]:
    """Two checkpoints of one model, no speculation, on the engines both ran on."""
    by_family: dict[str, dict[str, dict[str, Config]]] = defaultdict(lambda: defaultdict(dict))
    for c in configs:
        if not c.speculative and c.checkpoint:
            by_family[c.family][c.checkpoint].setdefault(c.engine or c.image, c)
    found = []
    for checkpoints in by_family.values():
        for a, b in combinations(checkpoints, 2):
            engines = [e for e in checkpoints[a] if e in checkpoints[b]]
            involved = [checkpoints[k][e] for k in (a, b) for e in engines]
            depth = _shared_depth(involved)
            if not engines or depth is None:
                continue
            va = mean(checkpoints[a][e].decode[depth] for e in engines)
            vb = mean(checkpoints[b][e].decode[depth] for e in engines)
            (fast, vf), (slow, vs) = sorted(((a, va), (b, vb)), key=lambda p: -p[1])
            where = f"{len(engines)} engines" if len(engines) > 1 else f"on {engines[0]}"
            found.append(f"{fast} = {vf / vs:.1f}× decode over {slow} ({vf:.1f} vs {vs:.1f} tok/s at depth "
                         f"{depth_label(depth)}, {where})")
    return found


def _speculation(configs: list[Config]) -> list[str]:
    found = []
    for c in configs:
        base = twin(c, configs)
        gain = {d: g for d, g in speedups(c, base).items() if g > 0} if base else {}
        if base and gain:
            found.append(_speedup(c, base, gain))
    return found


def _speedup(c: Config, base: Config, gain: dict[int, float]) -> str:
    label = f"{c.name} ({c.speculation or 'speculative'}{f' on {c.checkpoint}' if c.checkpoint else ''})"
    depths = sorted(gain)
    span = f"{depth_label(depths[0])}–{depth_label(depths[-1])}"
    found = crossover(gain)
    if found:
        through = [d for d in depths if d <= found[0]]
        first, last = found[1], depths[-1]
        after = f"{c.decode[first]:.1f} vs {base.decode[first]:.1f} tok/s @{depth_label(first)}"
        if last != first:
            after += f", down to {c.decode[last]:.1f} vs {base.decode[last]:.1f} @{depth_label(last)}"
        best = max(gain[d] for d in through)
        if len(through) == 1:
            fast = f"{c.decode[found[0]]:.1f} tok/s ({best:.1f}× over {base.name}) at depth {depth_label(found[0])}"
        else:
            fast = (f"{_range([c.decode[d] for d in through])} tok/s (up to {best:.1f}× over {base.name}) through "
                    f"{depth_label(found[0])} context")
        return f"{label} hits {fast}, then falls below it from {depth_label(first)} ({after})"
    low, high = min(gain.values()), max(gain.values())
    if low >= 1:
        return (f"{label} runs {low:.1f}–{high:.1f}× over {base.name} ({_range([c.decode[d] for d in depths])} "
                f"tok/s) at every measured depth ({span}), no crossover")
    if high < 1:
        return f"{label} is slower than {base.name} at every measured depth ({span}: {low:.2f}–{high:.2f}×)"
    return f"{label} ranges {low:.2f}–{high:.2f}× over {base.name} across depths {span}, with no lasting crossover"


def _fastest(configs: list[Config]) -> str:
    depth = _shared_depth(configs)
    if depth is None:
        return ""
    ranked = sorted(configs, key=lambda c: -c.decode[depth])
    top = ranked[0]
    if len(ranked) == 1:
        deeper = [d for d in sorted(_decode(top)) if d > depth]
        more = f", {top.decode[deeper[-1]]:.1f} at depth {depth_label(deeper[-1])}" if deeper else ""
        return f"{top.name} decodes {top.decode[depth]:.1f} tok/s at depth {depth_label(depth)}{more}"
    second = ranked[1]
    return (f"{top.name} decodes fastest: {top.decode[depth]:.1f} tok/s at depth {depth_label(depth)}, "
            f"{top.decode[depth] / second.decode[depth]:.1f}× the next best ({second.name}, "
            f"{second.decode[depth]:.1f} tok/s)")


def _untwinned(configs: list[Config]) -> str:
    """Speculative configs whose speedup cannot be measured: no no-spec twin in the report."""
    alone = [c.name for c in configs if c.speculative and twin(c, configs) is None]
    if not alone:
        return ""
    verb = "has" if len(alone) == 1 else "have"
    return f"{', '.join(alone)} {verb} no no-spec twin in this report, so speculation's gain is not measured"


def _decode(c: Config) -> dict[int, float]:
    """Measured decode only: 0 is a rate llama-benchy could not time."""
    return {d: v for d, v in c.decode.items() if v > 0}


def _shared_depth(configs) -> int | None:
    """The shallowest depth every config measured."""
    shared = set.intersection(*(set(_decode(c)) for c in configs)) if configs else set()
    return min(shared) if shared else None


def _range(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}–{high:.1f}"
