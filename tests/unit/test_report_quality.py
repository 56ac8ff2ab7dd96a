"""The report's Quality section (issue 49): each config's quality run beside its benchmark, with
the task, items, accuracy and its 95 % confidence interval, the tool and its version, the
fingerprint it measured and the gate's verdict; the run of the benchmarked deployment chosen
from the store when there is one."""

from __future__ import annotations

from pathlib import Path

from sparkctl import report
from sparkctl.report import quality
from sparkctl.spec.load import load_catalog
from sparkctl.state.bench import BenchRun
from sparkctl.state.quality import Measured, QualityRun
from sparkctl.state.store import Store
from tests.seedshape import ROOT

ROW = {"depth": 0, "concurrency": 1, "pp_tps": 900.0, "tg_tps": 81.0, "ttft_ms": 400.0}


def test_the_report_has_a_quality_section_per_config_with_its_interval_tool_and_fingerprint(tmp_path: Path) -> None:
    catalog = load_catalog(ROOT / "stacks", ROOT / "patches")
    gemma, qwen = catalog.stack("aeon-gemma4-v2"), catalog.stack("qwen36-dflash")
    runs = [BenchRun(1, gemma.name, "f" * 64, {}, "quick", "", 1.0, 2.0, None, None, [ROW]),
            BenchRun(2, qwen.name, "a" * 64, {}, "quick", "", 1.0, 2.0, None, None, [ROW])]
    checked = {gemma.name: QualityRun(4, gemma.name, "f" * 64, {}, "sparkctl_arith", 200, 1.0, 2.0, 0.9, 0.02,
                                      "lm-eval 0.4.13", "", None, "pass"),
               qwen.name: QualityRun(5, qwen.name, "e" * 64, {}, "sparkctl_arith", 50, 1.0, 2.0, 0.3, 0.065,
                                     "lm-eval 0.4.13", "", None, "fail: accuracy 30.0% < 70.0% floor (quality run 5)")}
    text = report.write([(gemma, runs[0]), (qwen, runs[1])], tmp_path / "out", bandwidth_gbs=273.0, title="t",
                        label="", quality=checked).read_text()
    assert "## Quality" in text
    assert "| aeon-gemma4-v2 | 4 | sparkctl_arith | 200 | 90.0% (86.1–93.9%) | lm-eval 0.4.13 | `ffffffffffff` | " \
           "pass |" in text
    assert "| qwen36-dflash | 5 | sparkctl_arith | 50 | 30.0% (17.3–42.7%) | lm-eval 0.4.13 | `eeeeeeeeeeee` " \
           "(not the benchmarked deployment) | fail: accuracy 30.0% < 70.0% floor (quality run 5) |" in text
    alone = report.write([(gemma, runs[0])], tmp_path / "none", bandwidth_gbs=273.0, title="t", label="").read_text()
    assert "## Quality" not in alone  # nothing measured: no section


def test_the_quality_run_reported_is_the_benchmarked_deployments_else_the_newest(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    ids = [store.quality.begin("s", fingerprint, {}, task="sparkctl_arith", items=50) for fingerprint in ("a", "b")]
    for run_id in ids:
        store.quality.finish(run_id, folder="", measured=Measured(50, 0.9, 0.04, "lm-eval 0.4.13"))
    bench = BenchRun(1, "s", "a", {}, "quick", "", 1.0, 2.0, None, None, [ROW])
    assert quality.chosen(store, bench).id == ids[0]
    assert quality.chosen(store, BenchRun(1, "s", "c", {}, "quick", "", 1.0, 2.0, None, None, [])).id == ids[1]
    assert quality.chosen(store, BenchRun(1, "t", "a", {}, "quick", "", 1.0, 2.0, None, None, [])) is None
