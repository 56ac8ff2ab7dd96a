"""A sim profile fitted to llama-benchy's results (its JSON, the format seed 000 publishes in
results/): the simulated engine then decodes and prefills as the Spark that was measured did, so a
switch plan or a routing rule can be tried against an owner's own curves.

Each single-stream decode figure becomes a point at the middle of the contexts its test decoded
over (`measured_at`), the placement the shipped profiles give seed 000's figures; prefill points
sit at their depth. The rest (load times, weights, acceptance, KV density) comes from a base
profile. Pure, and part of the sim package (no other sparkctl import): `sparkctl sim calibrate`
reads the files and prints the profile, and the sim loads it from `SPARKCTL_SIM_PROFILE_FILE`."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from typing import Any

from sparkctl.sim.profiles import Profile, measured_at


def fit(results: list[dict[str, Any]], base: Profile, name: str) -> Profile:
    """`base` with decode and prefill curves through the single-stream figures of `results`."""
    decode: dict[int, float] = {}
    prefill: dict[int, float] = {}
    for result in results:
        for test in result.get("benchmarks") or []:
            if test.get("concurrency") != 1 or test.get("is_context_prefill_phase"):
                continue
            depth = int(test["context_size"])
            if tps := (test.get("tg_throughput") or {}).get("mean"):
                decode[measured_at(depth, pp=int(test["prompt_size"]), tg=int(test["response_size"]))] = float(tps)
            if tps := (test.get("pp_throughput") or {}).get("mean"):
                prefill[depth] = float(tps)
    if not decode:
        raise ValueError("no single-stream decode figure in the results: run llama-benchy at concurrency 1")
    return replace(base, name=name, decode=tuple(sorted(decode.items())),
                   prefill=tuple(sorted(prefill.items())) or base.prefill)


def dumps(profile: Profile) -> str:
    return json.dumps(asdict(profile), indent=2)


def loads(text: str, where: str) -> Profile:
    """A profile `dumps` wrote; a ValueError naming `where` and what is wrong for anything else."""
    try:
        data = json.loads(text)
        data["decode"] = tuple((int(d), float(v)) for d, v in data["decode"])
        data["prefill"] = tuple((int(d), float(v)) for d, v in data["prefill"])
        return Profile(**data)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{where}: not a sim profile (`sparkctl sim calibrate` writes one): {e}") from None
