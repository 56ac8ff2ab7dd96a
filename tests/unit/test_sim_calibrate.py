"""`sparkctl sim calibrate`: a sim profile fitted to llama-benchy's results. The shipped seed 000
profiles are what it fits from the seed's own figures; a profile survives its JSON; bad input
names the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.sim import calibrate
from sparkctl.sim.profiles import PROFILES

# seed 000:5, measured with llama-benchy --pp 512 --tg 256 (seed 000:18); DFlash's "21-26 tok/s
# through 8k" is a range, its ends read as depths 0 and 8192 (no figure at any depth between)
SEED_000 = {"qwen36-nvfp4": {0: 8.9, 12288: 8.6, 65536: 7.7},
            "qwen36-dflash-n8": {0: 26.0, 8192: 21.0, 12288: 7.5, 65536: 5.7}}


def results(points: dict[int, float], *, pp: int = 512, tg: int = 256) -> dict:
    """llama-benchy's JSON of single-stream tests at these depths (one concurrent test and a
    prefix-mode context phase beside them, which the fit leaves out)."""
    tests = [{"context_size": d, "prompt_size": pp, "response_size": tg, "concurrency": 1,
              "tg_throughput": {"mean": tps}} for d, tps in points.items()]
    return {"version": "0.4.0", "benchmarks": [*tests, {**tests[0], "concurrency": 4, "tg_throughput": {"mean": 1.0}},
                                              {**tests[0], "is_context_prefill_phase": True}]}


@pytest.mark.parametrize("name", sorted(SEED_000))
def test_the_shipped_profiles_are_what_it_fits_from_the_seeds_figures(name: str) -> None:
    assert calibrate.fit([results(SEED_000[name])], PROFILES[name], name) == PROFILES[name]


def test_a_profile_survives_its_json_and_a_bad_file_is_named() -> None:
    fitted = calibrate.fit([results({0: 30.0, 8192: 25.0})], PROFILES["qwen36-nvfp4"], "mine")
    assert fitted.decode == ((640, 30.0), (8832, 25.0)) and fitted.weights_gib == PROFILES["qwen36-nvfp4"].weights_gib
    assert calibrate.loads(calibrate.dumps(fitted), "x") == fitted
    with pytest.raises(ValueError, match="mine.json: not a sim profile"):
        calibrate.loads('{"name": "x"}', "mine.json")
    with pytest.raises(ValueError, match="no single-stream decode figure"):
        calibrate.fit([{"benchmarks": []}], PROFILES["qwen36-nvfp4"], "x")


def test_sparkctl_sim_calibrate_prints_the_profile(tmp_path: Path, cli) -> None:
    (tmp_path / "run.json").write_text(json.dumps(results({0: 30.0, 8192: 25.0})))
    code, out, err = cli("sim", "calibrate", str(tmp_path / "run.json"), "--base", "aeon-gemma4-v2", "--name", "mine")
    assert code == 0, err
    profile = calibrate.loads(out, "stdout")
    assert (profile.name, profile.decode, profile.acceptance) == ("mine", ((640, 30.0), (8832, 25.0)), 0.58)
    code, _, err = cli("sim", "calibrate", str(tmp_path / "run.json"), "--base", "nope")
    assert code == 1 and "--base nope: no such profile" in err
    (tmp_path / "bad.json").write_text("{")
    code, _, err = cli("sim", "calibrate", str(tmp_path / "bad.json"))
    assert code == 1 and "bad.json: not llama-benchy's JSON" in err
