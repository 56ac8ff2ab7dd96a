"""The report against seed 000's own description of its comparison, section by section: built from
runs shaped like the seed's nine configs (decode and prefill from the sim's calibrated profiles,
run folders with llama-benchy's raw JSON and an environment.json holding the seed's machine,
engines and dates), comparison.md must open with a headline whose figures are the seed's, then
have the seed's Environment rows, its Configs tested columns, its Contents (and the files they
name), and its Caveats, in the seed's order. The seed's words are copied here: the project never
reads the seeds."""

from __future__ import annotations

import json
import re

import pytest

from sparkctl import report
from sparkctl.state.store import Store
from tests.seedshape import CONFIGS, seed_study

# Seed 000, as published: its headline, its Environment rows, its Configs tested, its Contents.
HEADLINE = ("engines are identical on decode (bandwidth-bound); NVFP4 = 2× decode over BF16 (8.9 vs 4.5 tok/s); "
            "DSpark-DFlash n=8 on the NVFP4 target hits 21–26 tok/s (up to 3×) through 8k context, then collapses "
            "below baseline past ~8k (7.5 vs 8.6 tok/s @12k, down to 5.7 vs 7.7 @64k)")
ENVIRONMENT = ("Target model", "Draft head", "Engines", "Draft patches", "GPU", "Driver / CUDA", "OS / kernel",
               "Benchmark tool", "Serving params (fixed)", "Benchmark params", "Date")
BENCHMARK_PARAMS = ("--pp 512 --tg 256 --exact-tg --runs 2 --latency-mode generation, depths 0 512 1024 2048 3072 "
                    "4096 6144 8192 12288 16384 24576 32768 49152 65536")
SERVING_PARAMS = ("--max-model-len 131072 --gpu-memory-utilization 0.80 --no-enable-prefix-caching "
                  "--enable-chunked-prefill")
COLUMNS = ("config", "checkpoint", "engine", "speculation")
# The seed's config names, its checkpoint, engine and speculation columns; and the stacks that are them.
SEED_CONFIGS = {
    "Q_bf16_stock_n0": ("qwen36-bf16-stock", "BF16", "vllm/vllm-openai", "none"),
    "Q_bf16_eugr_n0": ("qwen36-bf16-eugr", "BF16", "eugr/spark-vllm", "none"),
    "Q_bf16_aeon_n0": ("qwen36-bf16-aeon", "BF16", "aeon-vllm-ultimate", "none"),
    "Q_nvfp4_stock_n0": ("qwen36-nvfp4-stock", "NVFP4", "vllm/vllm-openai", "none"),
    "Q_nvfp4_eugr_n0": ("qwen36-nvfp4-eugr", "NVFP4", "eugr/spark-vllm", "none"),
    "Q_nvfp4_aeon_n0": ("qwen36-nvfp4-aeon", "NVFP4", "aeon-vllm-ultimate", "none"),
    "Q_bf16_dfl1": ("qwen36-bf16-dflash-n1", "BF16", "aeon-vllm-ultimate", "dflash n=1"),
    "Q_bf16_dfl8": ("qwen36-bf16-dflash-n8", "BF16", "aeon-vllm-ultimate", "dflash n=8"),
    "Q_nvfp4_dfl8": ("qwen36-dflash", "NVFP4", "aeon-vllm-ultimate", "dflash n=8"),
}
CONTENTS = ("comparison.md", "dataset.csv / dataset.json", "graphs/", "results/")
SECTIONS = ("**Headline:**", "## Environment", "## Configs tested", "## Contents", "## Caveats")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seed000")
    entries = seed_study(Store(tmp / "s.db"), tmp / "runs")
    return report.write(entries, tmp / "study", bandwidth_gbs=273.0, title="Qwen3.6-27B-AEON on DGX Spark",
                        label="seed 000's shape").parent


@pytest.fixture(scope="module")
def text(folder) -> str:
    return (folder / "comparison.md").read_text()


def test_sections_come_in_the_seeds_order(text) -> None:
    at = [text.find(section) for section in SECTIONS]
    assert -1 not in at and at == sorted(at)
    assert text.splitlines()[6].startswith("**Headline:**")  # under the title, its label and the intro, as in seed 000


def test_an_intro_line_says_what_was_measured_on_what_with_which_tool(text) -> None:
    intro = text.split("\n\n")[2]  # after the title and the label, as seed 000 opens
    assert intro.startswith("Single-stream inference benchmarks of AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored")
    assert "on NVIDIA GB10, SM 12.1" in intro and "comparing 9 configs" in intro
    assert "Measured with llama-benchy 0.4.0" in intro


def test_the_headline_has_the_seeds_figures(text) -> None:
    ours = _headline(text)
    engines = re.search(r"engines decode within ([\d.]+)% of each other", ours)
    assert engines and float(engines[1]) < 1  # the seed: identical
    seed_quant = re.search(r"NVFP4 = (\d+)× decode over BF16 \(([\d.]+) vs ([\d.]+) tok/s", HEADLINE)
    quant = re.search(r"NVFP4 = ([\d.]+)× decode over BF16 \(([\d.]+) vs ([\d.]+) tok/s", ours)
    assert quant and float(quant[1]) == pytest.approx(float(seed_quant[1]), abs=0.05)
    assert (quant[2], quant[3]) == (seed_quant[2], seed_quant[3])
    seed_dflash = re.search(r"hits (\d+)–(\d+) tok/s \(up to (\d+)×\) through (\w+) context.*\(([\d.]+) vs ([\d.]+) "
                            r"tok/s @(\w+), down to ([\d.]+) vs ([\d.]+) @(\w+)\)", HEADLINE)
    dflash = re.search(r"qwen36-dflash \(dflash n=8 on NVFP4\) hits ([\d.]+)–([\d.]+) tok/s \(up to ([\d.]+)× over "
                       r"qwen36-nvfp4-aeon\) through (\w+) context, then falls below it from \w+ \(([\d.]+) vs "
                       r"([\d.]+) tok/s @(\w+), down to ([\d.]+) vs ([\d.]+) @(\w+)\)", ours)
    assert dflash, ours
    assert [float(dflash[i]) for i in (1, 2)] == [float(seed_dflash[i]) for i in (1, 2)]  # 21-26 tok/s
    assert float(dflash[3]) == pytest.approx(float(seed_dflash[3]), abs=0.15)  # up to ~3x
    assert dflash[4] == seed_dflash[4] == "8k"  # the crossover: faster through 8k ...
    assert [dflash[i] for i in range(5, 11)] == [seed_dflash[i] for i in range(5, 11)]  # ... 7.5 vs 8.6 @12k ...


def test_the_crossover_lies_between_8192_and_12288(text) -> None:
    assert "- qwen36-dflash vs qwen36-nvfp4-aeon: up to 2.92x (depth 0); faster through depth 8192, slower from " \
           "12288 (crossover)" in text


def test_environment_has_the_seeds_rows_filled_from_the_runs(text) -> None:
    rows = dict(_table(text, "## Environment"))
    assert tuple(rows) == ENVIRONMENT
    assert rows["Target model"] == "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored (NVFP4, BF16 checkpoints)"
    assert rows["Draft head"].startswith("Hikari07jp/DSpark-Qwen3.6-27B-AEON-draft: dflash n=8, 1")
    assert all(version in rows["Engines"] for version in ("0.24.0", "0.23.1rc1.dev899", "0.23.0+aeon.sm121a.dflash"))
    assert rows["Draft patches"].startswith("dspark-dflash")
    assert rows["GPU"] == "NVIDIA GB10, SM 12.1, 119 GiB, ~273 GB/s (memory_bandwidth_gbs)"  # seed 000:15
    assert rows["Driver / CUDA"] == "580.159.03 / CUDA 13.0"
    assert rows["OS / kernel"] == "Ubuntu 24.04.4 LTS, kernel 6.17.0-1026-nvidia, aarch64; host zgx-5457"
    assert rows["Benchmark tool"] == "llama-benchy 0.4.0"
    assert rows["Serving params (fixed)"] == SERVING_PARAMS
    assert _params(rows["Benchmark params"]) == _params(BENCHMARK_PARAMS)
    assert rows["Date"] == "2026-07-09 to 2026-07-10"
    assert "unknown" not in "".join(rows.values())


def test_configs_tested_has_the_seeds_columns_and_configs(text) -> None:
    header, *rows = _table(text, "## Configs tested", header=True)
    assert header[:4] == COLUMNS
    found = {row[0]: row for row in rows}
    assert len(found) == 9
    for stack, checkpoint, engine, speculation in SEED_CONFIGS.values():
        row = found[stack]
        assert row[1] == checkpoint and engine in row[2] and row[3].startswith(speculation)
    assert found["qwen36-dflash"][4] == "--quantization compressed-tensors --attention-backend flash_attn " \
                                        "--mamba-cache-dtype float32"  # DFlash configs add their flags
    assert found["qwen36-nvfp4-stock"][5].startswith("2.5 full-context requests fit (KV cache 327K tokens")
    assert found["qwen36-bf16-stock"][5].startswith("1.")  # BF16's weights leave room for about one


def test_contents_lists_the_files_beside_it(folder, text) -> None:
    listed = _section(text, "## Contents")
    assert [next((item for item in CONTENTS if line.startswith(f"- {item}")), None) for line in listed] == \
        list(CONTENTS)
    assert "(9 configs × 14 depths)" in listed[1]
    assert (folder / "dataset.csv").is_file() and (folder / "dataset.json").is_file()
    assert len(list((folder / "graphs").glob("*.png"))) == 4
    for name in CONFIGS:
        raw = json.loads((folder / "results" / f"{name}.json").read_text())
        assert len(raw["benchmarks"]) == 14  # each run's raw llama-benchy JSON, as it was


def test_caveats_as_the_seed_ends(text) -> None:
    caveats = _section(text, "## Caveats")
    assert caveats[0] == "- Single-stream (concurrency=1), runs=2."  # the seed's words exactly
    assert any("content-dependent" in line for line in caveats)  # "Decode with DFlash is content-dependent"
    assert any("Prefix caching with this draft hangs" in line and "(source: seed 000:" in line for line in caveats)
    assert caveats[-1] == "- Numbers are specific to these images, models, hardware and dates."


def _params(text: str) -> tuple[list[str], str]:
    """llama-benchy's options (in any order) and the depths, from `--pp 512 ... , depths 0 512 ...`."""
    options, depths = text.split(", depths ")
    return sorted(options.split(" --")), depths


def _headline(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("**Headline:**"))


def _section(text: str, heading: str) -> list[str]:
    body = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in body.splitlines() if line.strip()]


def _table(text: str, heading: str, *, header: bool = False) -> list[tuple[str, ...]]:
    lines = [line for line in _section(text, heading) if line.startswith("|") and not line.startswith("|---")]
    rows = [tuple(cell.strip() for cell in line.strip("|").split(" | ")) for line in lines]
    return rows if header else rows[1:]
