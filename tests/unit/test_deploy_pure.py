"""Pure parts of the deploy pipeline: the shim, unified diffs, memory admission, health hints,
acceptance from metrics, and the state store."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

from sparkctl.bench.metrics import between
from sparkctl.deploy import edits
from sparkctl.deploy.edits import ShimError, apply_shim
from sparkctl.deploy.health import HealthError
from sparkctl.phase import Phase
from sparkctl.policy.admission import admit
from sparkctl.state.journal import Answers
from sparkctl.state.store import Store

SHIM = {"_draft_kv_cache_group_ids": "()", "_draft_layer_to_kv_cache_gid": "{}"}
PLAIN = "import x\n\n\nclass DFlashProposer(Base):\n    def __init__(self):\n        pass\n"
DOC = 'class DFlashProposer(Base):\n    """Doc."""\n\n    x = 1\n'
DECORATED = "class DFlashProposer(Base):\n    @property\n    def a(self):\n        return 1\n"
NESTED = "if True:\n    class DFlashProposer(Base):\n        def f(self):\n            pass\n"
CRLF = "class DFlashProposer(Base):\r\n    def f(self):\r\n        pass\r\n"


@pytest.mark.parametrize(("source", "expected"), [
    (PLAIN, "class DFlashProposer(Base):\n    _draft_kv_cache_group_ids = ()\n    _draft_layer_to_kv_cache_gid = {}\n"
            "    def __init__"),
    (DOC, '    """Doc."""\n    _draft_kv_cache_group_ids = ()\n    _draft_layer_to_kv_cache_gid = {}\n\n    x = 1'),
    (DECORATED, "Base):\n    _draft_kv_cache_group_ids = ()\n    _draft_layer_to_kv_cache_gid = {}\n    @property"),
    (NESTED, "Base):\n        _draft_kv_cache_group_ids = ()\n"
             "        _draft_layer_to_kv_cache_gid = {}\n        def f"),
    (CRLF, "Base):\r\n    _draft_kv_cache_group_ids = ()\r\n    _draft_layer_to_kv_cache_gid = {}\r\n    def f"),
])
def test_shim_inserts_two_lines_and_nothing_else(source: str, expected: str) -> None:
    result = apply_shim(source, "DFlashProposer", SHIM)
    assert expected in result
    assert result.replace("_draft_kv_cache_group_ids = ()", "").replace("_draft_layer_to_kv_cache_gid = {}", "") \
        .count("\n") == source.count("\n") + 2
    assert apply_shim(result, "DFlashProposer", SHIM) == result  # idempotent
    ast.parse(result)


def test_shim_adds_only_what_is_missing() -> None:
    half = PLAIN.replace("    def __init__", "    _draft_kv_cache_group_ids = (1,)\n    def __init__")
    result = apply_shim(half, "DFlashProposer", SHIM)
    assert "_draft_kv_cache_group_ids = (1,)" in result and result.count("_draft_kv_cache_group_ids") == 1
    assert "_draft_layer_to_kv_cache_gid = {}" in result


@pytest.mark.parametrize(("source", "words"), [
    ("class Other:\n    pass\n", "no class 'DFlashProposer' to shim (classes here: Other)"),
    ("class DFlashProposer: pass\n", "body on the header line"),
    ("def broken(:\n", "not valid Python"),
    ("class DFlashProposer:\n    pass\nclass DFlashProposer:\n    pass\n", "defined 2 times"),
])
def test_shim_refuses_clearly(source: str, words: str) -> None:
    with pytest.raises(ShimError, match=words.replace("(", r"\(").replace(")", r"\)")):
        apply_shim(source, "DFlashProposer", SHIM, filename="dflash.py")


def test_shim_value_must_be_an_expression() -> None:
    with pytest.raises(ShimError, match="not a Python expression"):
        apply_shim(PLAIN, "DFlashProposer", {"x": "def"})


DIFF = """--- a/vllm/x.py
+++ b/vllm/x.py
@@ -2,3 +2,4 @@
 b = 2
-c = 3
+c = 30
+d = 4
 e = 5
"""


def test_diff_applies_with_offset_and_names_the_failing_hunk() -> None:
    [file_diff] = edits.parse_diff(DIFF)
    assert file_diff.path == "vllm/x.py"
    assert edits.apply_diff("a = 1\nb = 2\nc = 3\ne = 5\n", file_diff) == "a = 1\nb = 2\nc = 30\nd = 4\ne = 5\n"
    shifted = "# new\n# lines\na = 1\nb = 2\nc = 3\ne = 5\n"
    assert "c = 30\nd = 4\n" in edits.apply_diff(shifted, file_diff)
    with pytest.raises(edits.DiffError, match=r"hunk 1 \(at line 2, starting 'b = 2'\) does not apply to vllm/x.py"):
        edits.apply_diff("a = 1\nb = 2\nc = 99\n", file_diff, source="mine.diff")
    with pytest.raises(edits.DiffError, match="no file changes"):
        edits.parse_diff("just text\n")


@pytest.mark.parametrize(("fraction", "running", "fits", "in_the_way"), [
    (0.80, {}, True, ()),
    (0.80, {"old": 0.80}, False, ("old",)),
    (0.30, {"a": 0.30, "b": 0.30}, True, ()),  # exactly at the ceiling
    (0.31, {"a": 0.30, "b": 0.30}, False, ("a",)),  # a tie is broken by name
    (0.40, {"a": 0.30, "b": 0.20}, True, ()),
    (0.85, {"a": 0.30, "b": 0.50}, False, ("b", "a")),
    (0.80, {"same": 0.80}, True, ()),  # the stack itself does not count against itself
])
def test_admission(fraction: float, running: dict, fits: bool, in_the_way: tuple) -> None:
    verdict = admit("same", fraction, running, ceiling=0.90)
    assert (verdict.fits, verdict.in_the_way) == (fits, in_the_way)
    if not fits:
        assert "--replace" in verdict.explain("same") and in_the_way[0] in verdict.explain("same")


@pytest.mark.parametrize(("logs", "hint"), [
    ("AttributeError: 'DFlashProposer' object has no attribute '_draft_layer_to_kv_cache_gid'", "2-line shim"),
    ("RuntimeError: unable to open shared memory object </torch_1> in read-write mode: /dev/shm", "shm_size"),
    ("ValueError: No available memory for the cache blocks.", "gpu_memory_utilization"),
    ("OSError: [Errno 98] error while attempting to bind: address already in use", "port is in use"),
    ("all good", None),
])
def test_health_hints(logs: str, hint: str | None) -> None:
    error = HealthError("engine exited", phase=Phase.LOADING, logs=logs)
    assert (hint in (error.hint or "")) if hint else error.hint is None
    assert logs in str(error)


def test_acceptance_from_metric_deltas() -> None:
    before = {"vllm:spec_decode_num_draft_tokens_total": 80, "vllm:spec_decode_num_accepted_tokens_total": 40}
    after = {"vllm:spec_decode_num_draft_tokens_total": 160, "vllm:spec_decode_num_accepted_tokens_total": 92}
    assert between(before, after).acceptance == pytest.approx(0.65)
    assert between(before, before).acceptance is None


def test_store_records_phases_and_survives_reopen(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    dep = store.deployments.begin("qwen36-dflash")
    store.deployments.advance(dep, Phase.PULLING, "ref")
    store.deployments.set_fingerprint(dep, "abc", {"image": "sha256:1"})
    store.deployments.advance(dep, Phase.FAILED, error="boom")
    store.digests.record("hf:a/b@main", "c0ffee")
    store.close()
    again = Store(tmp_path / "s.db")
    latest = again.deployments.latest("qwen36-dflash")
    assert (latest.phase, latest.error, latest.fingerprint, latest.parts) == (Phase.FAILED, "boom", "abc",
                                                                                 {"image": "sha256:1"})
    assert latest.finished is not None and Phase.FAILED.is_terminal() and not Phase.LOADING.is_terminal()
    assert [p for p, _, _ in again.deployments.transitions(dep)] == [Phase.RESOLVING, Phase.PULLING, Phase.FAILED]
    assert again.digests.get("hf:a/b@main") == "c0ffee" and again.integrity_ok()
    assert again.db.one("PRAGMA journal_mode")[0] == "wal"


def test_a_registry_answer_is_asked_again_only_after_a_minute(tmp_path: Path) -> None:
    store, asked = Store(tmp_path / "s.db"), []

    def registry(ref: str) -> str | None:
        asked.append(ref)
        return None if ref.endswith(":gone") else "sha256:bb"

    store.answers.record("ghcr.io/a/b:1", "sha256:aa", now=time.time() - Answers.KEPT_S + 5)
    assert store.answers.ask("ghcr.io/a/b:1", registry) == "sha256:aa" and asked == []  # not asked
    store.answers.record("ghcr.io/a/b:1", "sha256:aa", now=time.time() - Answers.KEPT_S - 1)
    assert store.answers.ask("ghcr.io/a/b:1", registry) == "sha256:bb" and asked == ["ghcr.io/a/b:1"]
    assert store.answers.ask("ghcr.io/a/b:1", registry) == "sha256:bb" and len(asked) == 1  # kept
    assert store.answers.ask("ghcr.io/a/b:gone", registry) is None
    assert store.answers.ask("ghcr.io/a/b:gone", registry) is None and len(asked) == 3  # no answer: not kept


def test_adapters_retry_only_transient_errors() -> None:
    from sparkctl.adapters.retry import transient
    from sparkctl.errors import SparkctlError, TransientError

    calls = []

    @transient(attempts=3, first_wait=0.001)
    def flaky(error: Exception) -> str:
        calls.append(error)
        if len(calls) < 3:
            raise error
        return "ok"

    assert flaky(TransientError("registry hiccup")) == "ok" and len(calls) == 3
    calls.clear()
    with pytest.raises(SparkctlError, match="permanent"):
        flaky(SparkctlError("permanent"))
    assert len(calls) == 1


def test_the_clis_store_reads_what_the_daemon_wrote_and_writes_nothing(tmp_path: Path) -> None:
    """The CLI opens the store read-only (`cli/runtime.py`): the daemon is its one writer."""
    import sqlite3

    from sparkctl.errors import SparkctlError

    Store(tmp_path / "s.db").bench.begin("qwen36-dflash", None, {}, "quick")
    read = Store(tmp_path / "s.db", readonly=True)
    assert [r.stack for r in read.bench.runs()] == ["qwen36-dflash"]
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        read.bench.begin("qwen36-dflash", None, {}, "quick")
    with pytest.raises(SparkctlError, match="the daemon makes it at its start"):
        Store(tmp_path / "none.db", readonly=True)
    assert not (tmp_path / "none.db").exists()


def test_admission_counts_the_parked_stacks_its_caller_gives(tmp_path: Path, monkeypatch) -> None:
    """The pipeline asks whoever runs it (the daemon, owner of desired.yaml) what is parked; it
    never reads desired.yaml itself, around the daemon's lock."""
    from types import SimpleNamespace

    from sparkctl.deploy import pipeline
    from sparkctl.state import desired

    desired.save(tmp_path / "desired.yaml", desired.Desired(parked={"on-file": 2}))
    seen = []
    monkeypatch.setattr(pipeline.MemoryView, "held", lambda _, parked: seen.append(dict(parked)) or {})
    settings = SimpleNamespace(state_dir=tmp_path, memory_ceiling=0.9)
    deployer = pipeline.Deployer(settings, None, None, None, None, None, None, parked=lambda: {"asked": 1})
    stack = SimpleNamespace(name="new", resources=SimpleNamespace(gpu_memory_utilization=0.4))
    assert deployer._admit(stack, replace=False) == ()
    assert seen == [{"asked": 1}]
