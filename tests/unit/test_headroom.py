"""KV headroom: reading the KV-cache size from vLLM's metrics and log in every shape it comes in,
the full-context fit and its warnings (seed 003's figures), the engine's flags from its command
line, and the headroom kept with its deployment across a restart."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sparkctl.bench.metrics import kv_tokens
from sparkctl.container import Inspected
from sparkctl.daemon.machine import log_headroom
from sparkctl.deploy.capacity import flag
from sparkctl.phase import Phase
from sparkctl.policy.headroom import Headroom, tokens
from sparkctl.state.db import MIGRATIONS
from sparkctl.state.store import Store

# What vLLM 0.32 (CPU build) emits: one info gauge, every CacheConfig field a label.
V032 = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.2",'
        'kv_cache_max_concurrency="6.0",kv_cache_size_tokens="12288",num_cpu_blocks="None",'
        'num_gpu_blocks="800"} 1.0\n')
OLD = 'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="20160"} 1.0\n'  # vLLM 0.20
LOG_020 = "(EngineCore_DP0 pid=71) INFO 06-10 12:00:01 [kv_cache_utils.py:1708] GPU KV cache size: 340,112 tokens\n"
LOG_032 = ("INFO 12-01 10:00:00 [kv_cache_utils.py:2328] CPU KV cache size: 12,288 tokens, Maximum concurrency "
           "for 2,048 tokens per request: 6.00x\n")


@pytest.mark.parametrize(("text", "expected"), [
    (V032, 12288),  # the group-aware label, not 800 x 16
    (V032 + LOG_020, 12288),  # the label beats the log
    (OLD, 20160 * 16),  # blocks x block size when nothing better is there
    (OLD + LOG_020, 340112),  # the log line beats blocks x size (wrong for hybrid models)
    (LOG_032, 12288),  # vLLM 0.32's line, with its concurrency on the same line
    (LOG_020 + LOG_020.replace("340,112", "322,368"), 322368),  # an engine started twice: the last
    ('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n', None),  # before profiling
    ("vllm:num_requests_running 0.0\n", None),
    ("", None),
])
def test_kv_tokens_takes_the_best_source(text: str, expected: int | None) -> None:
    assert kv_tokens(text) == expected


def test_seed_003_diffusiongemma_fits_13_7_full_context_requests_and_nothing_falls_short() -> None:
    headroom = Headroom(kv_tokens=3_590_000, max_model_len=262_144, max_num_seqs=4, min_kv_tokens=3_000_000)
    assert headroom.summary() == "13.7 full-context requests fit (KV cache 3.59M tokens, max_model_len 262,144)"
    assert headroom.warnings() == ()
    assert headroom.as_row().full_context == 13.7


def test_fewer_full_context_requests_than_max_num_seqs_says_the_rest_queue() -> None:
    """Aeon Gemma-4 as seed 003 ran it: ~340K KV tokens, 262K context, max_num_seqs 64."""
    [warning] = Headroom(kv_tokens=340_000, max_model_len=262_144, max_num_seqs=64).warnings()
    assert warning.startswith("only 1.30 full-context requests fit in the KV cache (340K tokens at max_model_len "
                              "262,144) but max_num_seqs is 64: requests beyond 1 at full context will queue")
    assert "lower max_model_len or max_num_seqs, or raise gpu_memory_utilization" in warning


def test_a_kv_cache_under_the_stack_expectation_is_a_warning_naming_the_key() -> None:
    [warning] = Headroom(kv_tokens=300_000, min_kv_tokens=322_000).warnings()
    assert "holds 300,000 tokens, under the stack's expectations.min_kv_tokens 322,000" in warning
    assert "raise resources.gpu_memory_utilization" in warning


@pytest.mark.parametrize(("headroom", "count"), [
    (Headroom(kv_tokens=300_000, max_model_len=262_144, max_num_seqs=2, min_kv_tokens=322_000), 2),
    (Headroom(kv_tokens=524_288, max_model_len=262_144, max_num_seqs=2), 0),  # exactly enough
    (Headroom(kv_tokens=100_000, max_model_len=262_144), 0),  # max_num_seqs unknown: nothing to compare
    (Headroom(kv_tokens=100_000, max_num_seqs=8), 0),  # context unknown: nothing to compare
])
def test_warnings_only_from_what_is_known(headroom: Headroom, count: int) -> None:
    assert len(headroom.warnings()) == count


def test_the_daemon_logs_the_headroom_and_each_shortfall_as_a_warning() -> None:
    with capture_logs() as logs:
        log_headroom("aeon", Headroom(kv_tokens=300_000, max_model_len=262_144, max_num_seqs=64, min_kv_tokens=322_000))
        log_headroom("silent", None)
    assert [(e["event"], e["stack"], e["log_level"]) for e in logs] == [
        ("kv_headroom", "aeon", "info"), ("kv_headroom_short", "aeon", "warning"),
        ("kv_headroom_short", "aeon", "warning"), ("kv_headroom_unknown", "silent", "warning")]
    assert logs[0]["full_context"] == pytest.approx(1.144, abs=1e-3) and logs[2]["needed"] == 64 * 262_144


def test_without_a_context_length_the_summary_gives_the_tokens_alone() -> None:
    headroom = Headroom(kv_tokens=322_560)
    assert headroom.full_context is None and headroom.summary() == "KV cache 323K tokens"
    assert headroom.as_row().full_context is None


def test_stored_form_round_trips_and_ignores_keys_a_later_version_adds() -> None:
    headroom = Headroom(kv_tokens=12288, max_model_len=2048, max_num_seqs=None, min_kv_tokens=1)
    assert Headroom.from_dict(headroom.as_dict() | {"source": "log"}) == headroom


@pytest.mark.parametrize(("n", "shown"), [(3_590_000, "3.59M"), (340_000, "340K"), (12_288, "12K"), (2048, "2,048")])
def test_token_counts_read_as_the_seeds_write_them(n: int, shown: str) -> None:
    assert tokens(n) == shown


@pytest.mark.parametrize(("argv", "expected"), [
    (["serve", "/model", "--max-num-seqs", "4"], 4),
    (["serve", "/model", "--max-num-seqs=4"], 4),  # compose's list form
    (["serve", "/model", "--max_num_seqs=8"], 8),  # vLLM reads underscores as dashes
    (["serve", "--max-num-seqs", "4", "--max-num-seqs", "16"], 16),  # argparse: the last wins
    (["serve", "--max-num-seqs=2k"], 2000),  # vLLM's human-readable sizes
    (["serve", "--max-num-seqs=1K"], 1024),
    (["serve", "--max-num-seqs-extra=4"], None),
    (["serve", "--max-num-seqs"], None),  # no value
    (["serve", "--max-num-seqs=auto"], None),
    (["serve", "/model"], None),
])
def test_flags_read_as_vllm_reads_them(argv: list[str], expected: int | None) -> None:
    assert flag(argv, "--max-num-seqs") == expected


def test_the_command_joins_entrypoint_and_command() -> None:
    inspected = {"Config": {"Entrypoint": ["vllm"], "Cmd": ["serve", "/model", "--max-model-len", "131072"]}}
    assert flag(list(Inspected.from_inspect(inspected).command), "--max-model-len") == 131072
    assert Inspected.from_inspect({"Config": {"Entrypoint": None, "Cmd": None}}).command == ()


def test_headroom_is_kept_per_build_and_survives_a_restart(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    first = store.deployments.begin("s")
    store.deployments.set_fingerprint(first, "fp1", {})
    store.deployments.set_headroom(first, Headroom(kv_tokens=12288, max_model_len=2048))
    again = store.deployments.begin("s")  # `up` found it running unchanged: nothing read
    store.deployments.set_fingerprint(again, "fp1", {})
    store.deployments.advance(again, Phase.RUNNING, "unchanged")
    store.close()
    store = Store(tmp_path / "state.db")  # a restarted daemon or CLI
    assert store.deployments.headroom("s", "fp1") == Headroom(kv_tokens=12288, max_model_len=2048)
    assert store.deployments.latest("s").headroom is None and store.deployments.headroom("s", "fp2") is None
    assert store.deployments.history("s")[-1].headroom.full_context == 6.0


def test_a_database_from_before_headroom_gains_the_column(tmp_path: Path) -> None:
    import sqlite3

    old = sqlite3.connect(tmp_path / "state.db")
    for script in MIGRATIONS[:4]:
        old.executescript(script)
    old.execute("INSERT INTO deployments (stack, phase, started) VALUES ('s', 'running', 1.0)")
    old.execute("PRAGMA user_version = 4")
    old.commit()
    old.close()
    store = Store(tmp_path / "state.db")
    assert store.deployments.latest("s").headroom is None
