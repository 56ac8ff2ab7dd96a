"""Benchmarks on a real dockerd with sim engines: `bench run` stores a gated run with its
fingerprint and engine counters, and `bench sweep` deploys configs one at a time and writes a
comparison report with seed 000's shape (NVFP4 ~2x BF16, DFlash n=8 up to ~3x, then the cliff)."""

from __future__ import annotations

import json

import pytest
from ruamel.yaml import YAML

from sparkctl.state.store import Store
from tests.conftest import ours

SCALED = "SPARKCTL_SIM_TIME_SCALE=0.05,SPARKCTL_SIM_LOAD_SCALE=0.002"  # decode 20x, loading near-instant


@pytest.fixture
def scaled(world, monkeypatch):
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", SCALED)
    return world


def test_bench_run_stores_a_gated_run_with_engine_counters(scaled, cli) -> None:
    assert cli("up", "qwen36-dflash")[0] == 0
    code, out, err = cli("bench", "run", "qwen36-dflash", "--profile", "quick", "--depths", "0,4096")
    assert code == 0, err
    assert "pass" in out
    [run] = Store(scaled / "state" / "sparkctl.db").bench.runs("qwen36-dflash")
    assert run.verdict == "pass" and run.parts["draft"] and run.parts["patches"]
    assert [r["depth"] for r in run.rows] == [0, 4096]
    assert all(0.5 < r["acceptance"] < 0.8 and r["acceptance_length"] > 4 and len(r["per_position"]) == 8
               for r in run.rows)  # the sim's DFlash profile accepts ~65% of drafted tokens
    pins = YAML(typ="safe").load((scaled / "stacks" / "images.yaml").read_text())["pins"]
    [pin] = [p for ref, p in pins.items() if "aeon-vllm-ultimate" in ref]
    assert pin["known_good"] and pin["digest"] == run.parts["image"] and f"run {run.id}" in pin["provenance"]


def test_sweep_writes_a_comparison_report_with_the_seed_shape(scaled, cli, engine, tmp_path) -> None:
    code, out, err = cli("bench", "sweep", "qwen36-nvfp4-stock", "qwen36-nvfp4-aeon", "qwen36-bf16-stock",
                         "qwen36-dflash", "--profile", "quick", "--depths", "0,8192,12288", "--out",
                         str(tmp_path / "report"), "--label", "measured on simulated engines")
    assert code == 0, err
    data = json.loads((tmp_path / "report" / "dataset.json").read_text())
    decode = {(r["config"], r["depth"]): r["decode_tps"] for r in data}
    assert len(data) == 4 * 3
    assert decode[("qwen36-nvfp4-stock", 0)] / decode[("qwen36-bf16-stock", 0)] == pytest.approx(2.0, rel=0.15)
    assert decode[("qwen36-nvfp4-stock", 0)] == pytest.approx(decode[("qwen36-nvfp4-aeon", 0)], rel=0.1)
    assert 2.3 < decode[("qwen36-dflash", 0)] / decode[("qwen36-nvfp4-aeon", 0)] < 3.5
    text = (tmp_path / "report" / "report.md").read_text()
    assert "faster through depth 8192, slower from 12288 (crossover)" in text
    assert not [c for c in ours(engine) if c["State"] == "running"]  # one at a time, then down
