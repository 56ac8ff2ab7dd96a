"""The comparison report: twins, speedups, the ~8k crossover, NVFP4 ~2x BF16, efficiency with its
assumption, the dataset files and graphs; the headline's parts, each only when the data has what it
needs (the demo's three unrelated stacks included); the Environment rows a run without
environment.json leaves unknown; the Caveats built from known issues, unmet expectations, the
corpus and the temperature. Seed 000's own description is checked in test_report_seed.py."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from sparkctl import report
from sparkctl.report import caveats, environment, markdown
from sparkctl.report.analysis import Config, checkpoint_of, crossover, family_of
from sparkctl.report.environment import Entry
from sparkctl.report.headline import headline
from sparkctl.spec.load import load_catalog
from sparkctl.spec.models import Expectations, KnownIssue
from sparkctl.state.bench import BenchRun
from sparkctl.state.store import Store
from tests.seedshape import ROOT, seed_study


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("report")
    entries = seed_study(Store(folder / "s.db"))
    path = report.write(entries, folder / "out", bandwidth_gbs=273.0, title="Qwen3.6-27B on DGX Spark",
                        label="measured on simulated engines", bans={"sha256:" + "b" * 64: "acceptance 0.10 < 0.40"})
    assert path.name == "comparison.md"
    return path.parent


@pytest.fixture(scope="module")
def catalog():
    return load_catalog(ROOT / "stacks", ROOT / "patches")


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
    text = (written / "comparison.md").read_text()
    assert "qwen36-dflash vs qwen36-nvfp4-aeon: up to 2.92x (depth 0); faster through depth 8192, slower from " \
           "12288 (crossover)" in text
    assert "memory bandwidth 273 GB/s" in text and "measured on simulated engines" in text
    assert "| qwen36-dflash | " in text and "acceptance 0.10 < 0.40" in text
    assert "## Prefill tok/s by context depth" in text and "| qwen36-dflash | 1800 | " in text
    assert all((written / "graphs" / name).stat().st_size > 10_000 for name in
               ("decode_vs_depth.png", "ttft_vs_depth.png", "prefill_vs_depth.png", "decode_by_config.png"))
    assert "![decode_vs_depth.png](graphs/decode_vs_depth.png)" in text


def test_runs_without_environment_json_read_unknown_and_copy_no_results(written) -> None:
    text = (written / "comparison.md").read_text()
    for row in ("GPU", "Driver / CUDA", "OS / kernel"):
        assert f"| {row} | unknown |" in text
    assert "| Benchmark tool | llama-benchy unknown |" in text
    assert "profile `seed`: --pp 512 --tg 256 --exact-tg --latency-mode generation" in text
    assert "(runs per depth not recorded)" in text and "runs per depth unknown (no environment.json)" in text
    assert "results/" not in text and not (written / "results").exists()
    assert " qwen36-bf16-dflash-n1 --profile seed\nsparkctl bench report 1 2 3 4 5 6 7 8 9   #" in text
    assert "| qwen36-dflash | NVFP4 | ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix | dflash n=8, " \
           "probabilistic | --quantization compressed-tensors --attention-backend flash_attn --mamba-cache-dtype " \
           "float32 | unknown |" in text  # flags as sparkctl renders the stack, minus the fixed ones


@pytest.mark.parametrize(("speedup", "expected"), [
    ({0: 3.0, 8192: 2.4, 12288: 0.9, 65536: 0.7}, (8192, 12288)),
    ({0: 3.0, 8192: 2.4}, None),
    ({0: 0.9, 8192: 1.1, 12288: 0.8}, (8192, 12288)),
    ({0: 1.2, 4096: 0.9, 8192: 1.1}, None),  # not slower for good
])
def test_crossover(speedup, expected) -> None:
    assert crossover(speedup) == expected


@pytest.mark.parametrize(("model", "checkpoint", "family"), [
    ("AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4", "NVFP4", "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored"),
    ("AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-BF16", "BF16", "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored"),
    ("Qwen/Qwen3-8B-FP8-dynamic", "FP8", "Qwen/Qwen3-8B-dynamic"),
    ("nvidia/diffusiongemma-26B-A4B-it-NVFP4", "NVFP4", "nvidia/diffusiongemma-26B-A4B-it"),
    ("/models/tiny", "", "/models/tiny"),
])
def test_checkpoint_and_family_from_the_model_name(model, checkpoint, family) -> None:
    assert (checkpoint_of(model), family_of(model)) == (checkpoint, family)


def _config(name: str, decode: dict[int, float], *, model: str = "org/Model-NVFP4", engine: str = "img:1",
            spec: str = "", extends: str | None = None) -> Config:
    return Config(name, model, engine.split(":")[0], extends, bool(spec), None, decode, engine=engine,
                  speculation=spec, checkpoint=checkpoint_of(model))


@pytest.mark.parametrize(("configs", "expected"), [
    pytest.param([_config("qwen36-dflash", {0: 26.0, 4096: 23.5}, model="AEON-7/Qwen3.6-NVFP4", spec="dflash n=8"),
                  _config("aeon-gemma4-v2-nospec", {0: 81.0, 4096: 78.0, 16384: 75.0}, model="AEON-7/Gemma-4-NVFP4"),
                  _config("diffusiongemma", {0: 210.0, 4096: 200.0}, model="nvidia/diffusiongemma-NVFP4")],
                 "diffusiongemma decodes fastest: 210.0 tok/s at depth 0, 2.6× the next best (aeon-gemma4-v2-nospec, "
                 "81.0 tok/s); qwen36-dflash has no no-spec twin in this report, so speculation's "
                 "gain is not measured.", id="the demo's three stacks"),
    pytest.param([_config("one", {0: 26.0, 4096: 23.5})], "one decodes 26.0 tok/s at depth 0, 23.5 at depth 4k.",
                 id="one config"),
    pytest.param([_config("a", {0: 9.0}), _config("b", {0: 8.5}, engine="img:2")],
                 "engines decode within 5.9% of each other (NVFP4 on 2 engines: 8.5–9.0 tok/s at depth 0).",
                 id="engine spread"),
    pytest.param([_config("q4", {0: 8.9, 512: 8.8}), _config("q16", {0: 4.5}, model="org/Model-BF16")],
                 "NVFP4 = 2.0× decode over BF16 (8.9 vs 4.5 tok/s at depth 0, on img:1).", id="one engine, two "
                 "checkpoints"),
    pytest.param([_config("base", {0: 10.0, 8192: 9.0}), _config("spec", {0: 20.0, 8192: 13.5}, spec="eagle3 n=3")],
                 "spec (eagle3 n=3 on NVFP4) runs 1.5–2.0× over base (13.5–20.0 tok/s) at every measured depth "
                 "(0–8k), no crossover.", id="always faster"),
    pytest.param([_config("base", {0: 10.0, 8192: 9.0}), _config("spec", {0: 5.0, 8192: 8.1}, spec="ngram n=4")],
                 "spec (ngram n=4 on NVFP4) is slower than base at every measured depth (0–8k: 0.50–0.90×).",
                 id="always slower"),
    pytest.param([_config("base", {0: 10.0, 8192: 9.0, 12288: 8.0}),
                  _config("spec", {0: 29.0, 8192: 7.0, 12288: 6.0}, spec="dflash n=8")],
                 "spec (dflash n=8 on NVFP4) hits 29.0 tok/s (2.9× over base) at depth 0, then falls below it from "
                 "8k (7.0 vs 9.0 tok/s @8k, down to 6.0 vs 8.0 @12k).", id="crossover after the first depth"),
    pytest.param([_config("a", {0: 0.0})], "no decode was measured, so there is nothing to compare.",
                 id="nothing timed"),
])
def test_headline_says_what_the_data_supports(configs, expected) -> None:
    assert headline(configs) == expected


def _entry(stack, rows: list[dict], env: dict | None = None) -> Entry:
    return Entry(stack, BenchRun(7, stack.name, None, {}, "quick", "", 1_760_000_000.0, None, None, None, rows),
                 env or {})


def _row(depth: int, decode: float, acceptance: float | None = None) -> dict:
    return {"depth": depth, "concurrency": 1, "pp_tps": 1000.0, "tg_tps": decode, "ttft_ms": 100.0,
            "acceptance": acceptance}


def test_caveats_carry_sources_caps_unmet_expectations_corpus_and_temperature(catalog) -> None:
    stack = catalog.stack("qwen36-dflash").model_copy(update={
        "known_issues": (KnownIssue(text="Crashes with 2+ requests.", max_concurrency=1, source="measured run 4"),
                         KnownIssue(text="Slow past 8k.", max_concurrency=2)),
        "expectations": Expectations(min_decode_tps=18.0, min_acceptance=0.4, min_kv_tokens=400_000)})
    env = {"kv_cache_tokens": 300_000, "temperature": 1.0, "corpus": {"kind": "loopback", "note": "generated prose"}}
    lines = caveats.caveats([_entry(stack, [_row(0, 12.0, 0.3), _row(4096, 11.0, 0.2)], env)])
    plain = caveats.caveats([_entry(stack, [_row(0, 20.0)], {"corpus": {"kind": "loopback"}}),
                             _entry(catalog.stack("qwen36-nvfp4-aeon"), [_row(0, 9.0)], {"corpus": {"kind": "book"}})])
    assert "Prompts came from sparkctl's loopback corpus (generated prose), not llama-benchy's book, for " \
           "qwen36-dflash: acceptance, and so speculative decode, may differ on real text." in plain
    assert any(line.startswith("llama-benchy drives near-greedy generation; a draft's acceptance gains are larger "
                               "under T=1.0 sampling") for line in plain)  # seed 000:51, greedy with a draft
    assert not any("near-greedy" in line for line in lines)  # sampled at T=1: the caveat above says so instead
    assert lines[0] == "Single-stream (concurrency=1), runs per depth unknown (no environment.json)."
    assert "qwen36-dflash: Crashes with 2+ requests (source: measured run 4). The gateway caps it at 1 concurrent " \
           "request." in lines
    assert "qwen36-dflash: Slow past 8k (source: none given). Its cap of 2 is advice, not enforced (no source; " \
           "`enforce: true` opts in)." in lines
    assert "qwen36-dflash: decode 12.0 tok/s at depth 0 is under its expected 18 " \
           "(expectations.min_decode_tps)." in lines
    assert "qwen36-dflash: mean acceptance 0.25 is under its expected 0.40 (expectations.min_acceptance)." in lines
    assert "qwen36-dflash: the engine reported 300,000 KV-cache tokens, under its expected 400,000 " \
           "(expectations.min_kv_tokens)." in lines
    assert "Prompt corpus (every run): generated prose." in lines
    assert "Sampled, not greedy: qwen36-dflash at T=1. Speculative acceptance (and so decode) depends on the " \
           "temperature." in lines
    assert lines[-1] == caveats.CLOSING


def test_met_expectations_greedy_and_a_book_add_no_caveat(catalog) -> None:
    env = {"temperature": 0.0, "corpus": {"kind": "book", "note": "llama-benchy's default book"},
           "profile": {"name": "quick", "args": ["--pp", "512", "--runs", "3", "--exact-tg"]}, "kv_cache_tokens": 10}
    lines = caveats.caveats([_entry(catalog.stack("qwen36-nvfp4-stock"), [_row(0, 9.0)], env)])
    assert lines == ["Single-stream (concurrency=1), runs=3.", caveats.CLOSING]


def test_environment_reads_flags_as_run_and_the_kv_headroom(catalog) -> None:
    stack = catalog.stack("aeon-gemma4-v2")
    env = {"engine": {"flags": "serve /model --port 9 --max-model-len 32768 --max-num-seqs 64", "vllm_version": "0.22"},
           "kv_cache_tokens": 340_000, "date": "2026-06-10T10:00:00+00:00",
           "host": {"gpu": "NVIDIA GB10", "driver": "unknown", "cuda": "unknown", "memory_gib": 119.6}}
    entry = _entry(stack, [_row(0, 81.0)], env)
    assert environment.flags(entry) == ["--max-model-len 32768", "--max-num-seqs 64"]
    assert environment.kv_headroom(entry) == \
        "10.4 full-context requests fit (KV cache 340K tokens, max_model_len 32,768)"
    rows = dict(environment.table([entry]))
    assert rows["GPU"] == "NVIDIA GB10, SM unknown, 119.6 GiB" and rows["Driver / CUDA"] == "unknown"  # as marked
    assert rows["Date"] == "2026-06-10"
    assert rows["Engines"] == "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2 (vLLM 0.22)"
    assert rows["Draft head"] == "z-lab/gemma-4-26B-A4B-it-DFlash: dflash n=10"
    assert environment.kv_headroom(_entry(stack, [])) == "unknown"
    unrecorded = _entry(stack, [], {"engine": {"flags": "unknown", "vllm_version": "unknown"}})
    assert f"--max-model-len {stack.vllm.max_model_len}" in environment.flags(unrecorded)  # as sparkctl renders it
    assert environment.engine(unrecorded) == "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2"


def test_reproduce_runs_each_config_when_their_depths_differ(catalog) -> None:
    lines = markdown._reproduce([_entry(catalog.stack("qwen36-dflash"), [_row(0, 26.0), _row(4096, 23.5)]),
                                 _entry(catalog.stack("diffusiongemma"), [_row(d, 210.0) for d in (0, 4096, 16384)])])
    assert lines[3:6] == [
        "sparkctl up qwen36-dflash && sparkctl bench run qwen36-dflash --profile quick --depths 0,4096",
        "sparkctl up diffusiongemma && sparkctl bench run diffusiongemma --profile quick",
        "sparkctl bench report 7 7   # this report, from the stored runs"]


@pytest.mark.parametrize("depths", [(0,), (0, 4096, 16384)])
def test_graphs_label_units_mark_the_crossover_and_draw_the_seeds_figure(depths: tuple[int, ...]) -> None:
    """A single depth is drawn as bars per config (a line through one point draws an axis around
    nothing); over several, speculative `b`'s crossover against its twin `a` is a marked point
    with its depth, and `a`'s seed figure a reference line (a mark over its bar for one depth)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from sparkctl import report

    gain = {0: 2.0, 4096: 1.2, 16384: 0.7}
    rows = [{"config": c, "depth": d, "concurrency": 1, "decode_tps": 10.0 + i + (gain[d] if c == "b" else 0),
             "speedup_vs_twin": gain[d] if c == "b" else None, "twin": "a" if c == "b" else None}
            for i, c in enumerate(("a", "b")) for d in depths]
    fig = report._by_depth(plt, rows, ["a", "b"], "decode_tps", "decode (tokens/s)", "test", {"a": 9.5})
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert ax.get_ylabel() == "decode (tokens/s)"
    if len(depths) == 1:
        assert ax.get_xscale() == "linear" and [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]
        assert [bar.get_height() for bar in ax.patches] == [10.0, 13.0] and ax.get_ylim()[0] == 0
        assert "at context depth 0 tokens" in ax.get_title() and texts == ["seed 9.5"]
    else:
        assert ax.get_xscale() == "symlog" and ax.get_xlabel() == "context depth (tokens)"
        assert "the seed's 9.5: a" in [line.get_label() for line in ax.lines]
        assert texts == ["crossover at depth 16384"]
        marked = next(line for line in ax.lines if line.get_marker() == "X")
        assert list(marked.get_xdata()) == [16384]
    plt.close(fig)


def test_aggregate_throughput_and_startup_and_memory_per_stack(catalog, tmp_path: Path) -> None:
    """Seed 003's two tables: decode summed over the streams above concurrency 1, and each stack's
    startup (from its deployment's phases) and memory (its share of the host, the KV cache)."""
    stack = catalog.stack("diffusiongemma")
    rows = [{**_row(0, 210.0), "concurrency": c, "tg_tps": tps, "failed": c == 16}
            for c, tps in ((1, 210.0), (4, 610.5), (16, 700.0))]
    run = BenchRun(7, stack.name, "fp", {}, "concurrency", str(tmp_path / "run"), 1_760_000_000.0, None, None, None,
                   rows)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "environment.json").write_text(json.dumps({"host": {"memory_gib": 119.6},
                                                                    "kv_cache_tokens": 3_590_000}))
    other = catalog.stack("aeon-gemma4-v2")
    quiet = BenchRun(8, other.name, None, {}, "quick", "", 1_760_000_000.0, None, None, None, [_row(0, 81.0)])
    text = report.write([(stack, run), (other, quiet)], tmp_path / "out", bandwidth_gbs=273.0, title="t", label="",
                        startups={stack.name: (12.25, 95.5)}).read_text()
    assert "| config | depth | 4 streams | 16 streams |" in text
    assert "| diffusiongemma | 0 | 610.5 | 700.0 (failed) |" in text and "| aeon-gemma4-v2 | 0 |" not in text
    assert "| diffusiongemma | 12.2 s | 95.5 s | 0.85 x 119.6 GiB = 101.7 GiB | 3,590,000 |" in text
    assert "| aeon-gemma4-v2 | unknown | unknown | 0.8 of memory | unknown |" in text


def test_a_cached_run_reports_the_ttft_with_the_context_cached_beside_the_cold_one(catalog, tmp_path: Path) -> None:
    stack = catalog.stack("aeon-gemma4-v2")
    rows = [{**_row(4096, 80.0), "ttft_ms": 2300.0, "cached_ttft_ms": 310.0}, {**_row(16384, 78.0)}]
    run = BenchRun(9, stack.name, "fp", {}, "cached", "", 1_760_000_000.0, None, None, None, rows)
    text = report.write([(stack, run)], tmp_path / "out", bandwidth_gbs=273.0, title="t", label="").read_text()
    assert "## Time to first token with the context cached (ms)" in text
    assert "| aeon-gemma4-v2 | 4096 | 1 | 2300 | 310 | 0.13 |" in text and "| aeon-gemma4-v2 | 16384 | 1 |" not in text


def test_the_startup_is_read_from_the_deployment_that_served_the_run(tmp_path: Path) -> None:
    from sparkctl.phase import Phase

    store = Store(tmp_path / "s.db")
    made = store.deployments.begin("s")
    store.deployments.set_fingerprint(made, "fp", {})
    for phase in (Phase.PULLING, Phase.STARTING, Phase.LOADING, Phase.RUNNING):
        store.deployments.advance(made, phase)
    started = store.deployments.latest("s").started
    at = {p: t for p, t, _ in store.deployments.transitions(made)}
    run = BenchRun(1, "s", "fp", {}, "quick", "", at[Phase.RUNNING] + 1, None, None, None, [])
    assert report._startup(store, run) == pytest.approx((at[Phase.STARTING] - started,
                                                        at[Phase.RUNNING] - at[Phase.STARTING]))
    assert report._startup(store, BenchRun(2, "s", "other", {}, "quick", "", at[Phase.RUNNING] + 1, None, None,
                                           None, [])) is None


def test_a_stacks_request_defaults_are_said_to_come_from_the_gateway_only(catalog) -> None:
    """DiffusionGemma's thinking default (seed 003:120) reaches the engine only through the gateway:
    a `bench run` at the engine's port, or a compose project run by hand, measures without it."""
    lines = caveats.caveats([_entry(catalog.stack("diffusiongemma"), [_row(0, 210.0)]),
                             _entry(catalog.stack("qwen36-nvfp4-stock"), [_row(0, 9.0)])])
    [said] = [line for line in lines if "request defaults" in line]
    assert said.startswith('diffusiongemma: its request defaults ({"chat_template_kwargs": {"enable_thinking": true}})'
                           " are added by sparkctl's gateway only: a run at the engine's own port (`sparkctl bench "
                           "run`) has none of them")
