"""The comparison report on seed 000's shape: twins, speedups, the ~8k crossover, NVFP4 ~2x BF16,
efficiency with its assumption, the dataset files and the graphs."""

from __future__ import annotations

import csv
import json

import pytest

from sparkctl import report
from sparkctl.report.analysis import crossover
from sparkctl.state.store import Store
from tests.seedshape import seed_study


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    entries = seed_study(Store(folder / "s.db"))
    path = report.write(entries, folder / "out", bandwidth_gbs=273.0, title="Qwen3.6-27B on DGX Spark",
                        label="measured on simulated engines", bans={"sha256:" + "b" * 64: "acceptance 0.10 < 0.40"})
    return path.parent


def test_dataset_has_one_row_per_config_and_depth(written) -> None:
    data = json.loads((written / "dataset.json").read_text())
    assert len(data) == 9 * 14 and len(list(csv.DictReader((written / "dataset.csv").open()))) == 9 * 14
    at = {(r["config"], r["depth"]): r for r in data}
    assert at[("qwen36-dflash", 0)]["twin"] == "qwen36-nvfp4-aeon"
    assert at[("qwen36-bf16-dflash-n8", 0)]["twin"] == "qwen36-bf16-aeon"
    assert at[("qwen36-dflash", 0)]["speedup_vs_twin"] == pytest.approx(26.0 / 8.9, rel=0.01)  # up to ~3x
    assert at[("qwen36-nvfp4-stock", 0)]["decode_tps"] / at[("qwen36-bf16-stock", 0)]["decode_tps"] == \
        pytest.approx(2.0, rel=0.02)  # NVFP4 ~ 2x BF16
    assert at[("qwen36-nvfp4-stock", 8192)]["decode_tps"] == at[("qwen36-nvfp4-eugr", 8192)]["decode_tps"]
    assert at[("qwen36-nvfp4-stock", 0)]["efficiency"] == pytest.approx(8.9 * 16 / 273, rel=0.01)


def test_report_states_the_crossover_assumptions_fingerprints_and_bans(written) -> None:
    text = (written / "report.md").read_text()
    assert "qwen36-dflash vs qwen36-nvfp4-aeon: up to 2.92x (depth 0); faster through depth 8192, slower from " \
           "12288 (crossover)" in text
    assert "memory bandwidth 273 GB/s" in text and "measured on simulated engines" in text
    assert "| qwen36-dflash | " in text and "Hardware: " in text and "acceptance 0.10 < 0.40" in text
    assert all((written / name).stat().st_size > 10_000 for name in
               ("decode_vs_depth.png", "ttft_vs_depth.png", "prefill_vs_depth.png", "decode_by_config.png"))


@pytest.mark.parametrize(("speedup", "expected"), [
    ({0: 3.0, 8192: 2.4, 12288: 0.9, 65536: 0.7}, (8192, 12288)),
    ({0: 3.0, 8192: 2.4}, None),
    ({0: 0.9, 8192: 1.1, 12288: 0.8}, (8192, 12288)),
    ({0: 1.2, 4096: 0.9, 8192: 1.1}, None),  # not slower for good
])
def test_crossover(speedup, expected) -> None:
    assert crossover(speedup) == expected
