"""The report's Caveats, as seed 000 ends with them, built from what the report knows: how many
streams and runs were measured, that speculative decode depends on the text, the stacks' known
issues with their sources (and whether the gateway enforces their caps), request defaults only the
gateway adds, the expectations a run did not meet (decode at depth 0, acceptance, KV-cache
tokens), the loopback corpus when a run used it, and a sampling temperature that is not greedy.
Pure; `markdown.py` calls it.
"""

from __future__ import annotations

import json
from statistics import mean

from sparkctl.report.environment import Entry, benchy_args

CLOSING = "Numbers are specific to these images, models, hardware and dates."


def caveats(entries: list[Entry]) -> list[str]:
    return [*_load(entries), *_content(entries), *_issues(entries), *_defaults(entries), *_expectations(entries),
            *_corpus(entries), *_temperature(entries), CLOSING]


def _load(entries: list[Entry]) -> list[str]:
    concurrency = sorted({r["concurrency"] for e in entries for r in e.run.rows})
    runs = sorted({n for e in entries for n in benchy_args(e).get("runs", [])})
    counted = f"runs={', '.join(runs)}" if runs else "runs per depth unknown (no environment.json)"
    if concurrency == [1]:
        return [f"Single-stream (concurrency=1), {counted}."]
    return [f"Concurrency {', '.join(map(str, concurrency))} (decode summed over the streams), {counted}."]


def _content(entries: list[Entry]) -> list[str]:
    rates = {e.stack.name: mean(rs) for e in entries
             if (rs := [r["acceptance"] for r in e.run.rows if r.get("acceptance") is not None])}
    if not rates:
        return []
    shown = ", ".join(f"{rate:.2f} ({name})" for name, rate in rates.items())
    return [f"Decode with speculation is content-dependent (acceptance varies with the text): mean acceptance {shown}."]


def _issues(entries: list[Entry]) -> list[str]:
    """Each known issue once, with the configs that carry it."""
    found: dict[tuple, list[str]] = {}
    for e in entries:
        for issue in e.stack.known_issues:
            found.setdefault((issue.text, issue.source, issue.max_concurrency, issue.enforced), []).append(e.stack.name)
    out = []
    for (text, source, cap, enforced), names in found.items():
        line = f"{', '.join(names)}: {text.strip().rstrip('.')} (source: {source or 'none given'})."
        if cap is not None:
            line += (f" The gateway caps it at {cap} concurrent request{'s' if cap > 1 else ''}." if enforced else
                     f" Its cap of {cap} is advice, not enforced (no source; `enforce: true` opts in).")
        out.append(line)
    return out


def _defaults(entries: list[Entry]) -> list[str]:
    """A stack's `request_defaults` (seed 003's thinking, say) are added by sparkctl's gateway alone."""
    return [f"{e.stack.name}: its request defaults ({json.dumps(e.stack.request_defaults, sort_keys=True)}) are added "
            "by sparkctl's gateway only: a run at the engine's own port (`sparkctl bench run`) has none of them, nor "
            "has a client of the engine or compose project started by hand; a switch's benchmark, through the "
            "gateway, has them." for e in entries if e.stack.request_defaults]


def _expectations(entries: list[Entry]) -> list[str]:
    out = []
    for e in entries:
        expect, single = e.stack.expectations, [r for r in e.run.rows if r["concurrency"] == 1]
        decode = next((r["tg_tps"] for r in single if r["depth"] == 0 and r["tg_tps"] > 0), None)
        if expect.min_decode_tps and decode is not None and decode < expect.min_decode_tps:
            out.append(f"{e.stack.name}: decode {decode:.1f} tok/s at depth 0 is under its expected "
                       f"{expect.min_decode_tps:g} (expectations.min_decode_tps).")
        rates = [r["acceptance"] for r in single if r.get("acceptance") is not None]
        if expect.min_acceptance and rates and mean(rates) < expect.min_acceptance:
            out.append(f"{e.stack.name}: mean acceptance {mean(rates):.2f} is under its expected "
                       f"{expect.min_acceptance:.2f} (expectations.min_acceptance).")
        tokens = e.get("kv_cache_tokens")
        if expect.min_kv_tokens and isinstance(tokens, int) and tokens < expect.min_kv_tokens:
            out.append(f"{e.stack.name}: the engine reported {tokens:,} KV-cache tokens, under its expected "
                       f"{expect.min_kv_tokens:,} (expectations.min_kv_tokens).")
    return out


def _corpus(entries: list[Entry]) -> list[str]:
    offline = [e for e in entries if e.get("corpus", "kind") == "loopback"]
    if not offline:
        return []
    names = "every run" if len(offline) == len(entries) else ", ".join(e.stack.name for e in offline)
    notes = "; ".join(dict.fromkeys(str(e.get("corpus", "note")) for e in offline if e.get("corpus", "note")))
    return [f"Prompt corpus ({names}): {notes}." if notes else
            f"Prompts came from sparkctl's loopback corpus (generated prose), not llama-benchy's book, for {names}: "
            "acceptance, and so speculative decode, may differ on real text."]


def _temperature(entries: list[Entry]) -> list[str]:
    sampled = {e.stack.name: t for e in entries if isinstance(t := e.get("temperature"), int | float) and t > 0}
    speculative = any(e.stack.vllm is not None and e.stack.vllm.speculative is not None for e in entries)
    if not sampled:  # seed 000:51's caveat, where it applies
        return ["llama-benchy drives near-greedy generation; a draft's acceptance gains are larger under T=1.0 "
                "sampling, so a speculative crossover may sit slightly further out in sampled chat workloads "
                "(`--profile sampled` measures at T=1.0)."] if speculative else []
    shown = ", ".join(f"{name} at T={t:g}" for name, t in sampled.items())
    return [f"Sampled, not greedy: {shown}. Speculative acceptance (and so decode) depends on the temperature."]
