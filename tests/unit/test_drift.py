"""Greedy drift's pure parts (issue 49): the comparison (identical count, the first divergence's
prompt, character and token, excerpts), which run is the baseline (a new build of the same
weights) and which the no-spec twin, the gate's verdict only where asked, `expectations.drift`
in a stack file and its errors, the report's section, and the sim's greedy replies."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl import report as comparison
from sparkctl.bench import drift
from sparkctl.phase import Phase
from sparkctl.report import drift as report
from sparkctl.settings import Settings
from sparkctl.sim.engine import Faults, Vocabulary
from sparkctl.spec.models import Drift
from sparkctl.state.drift import GreedyRun, Output
from sparkctl.state.store import Store
from tests.fakes.tinymodel import write_model
from tests.seedshape import seed_study

PARTS = {"image": "sha256:" + "a" * 64, "model": "c0ffee", "draft": "", "patches": "p1", "spec": "s1"}


def run(id: int, outputs: tuple[Output, ...] = (), *, stack: str = "a", speculative: bool = False,
        verdict: str | None = "pass", **parts: str) -> GreedyRun:
    return GreedyRun(id, stack, f"fp-{id}", PARTS | parts, "org/m", speculative, "sha256:k", 0.0, outputs, verdict)


def test_identical_outputs_are_n_of_n() -> None:
    same = (Output("one two", (1, 2)), Output("three", (3,)))
    found = drift.compare(same, same)
    assert (found.identical, found.total, found.first, found.share) == (2, 2, None, 1.0)
    assert found.describe() == "2 of 2 identical"


def test_the_first_divergence_names_its_prompt_character_token_and_both_sides() -> None:
    base = "The quick brown fox jumps over the lazy dog and runs into the forest far away"
    ours = (Output("same", (1,)), Output(base, (5, 6, 7, 8)), Output("x", (9,)))
    theirs = (Output("same", (1,)), Output(base.replace("lazy", "sleepy"), (5, 6, 7, 4)), Output("y", (9,)))
    found = drift.compare(ours, theirs)
    at = base.index("lazy")
    assert (found.identical, found.total) == (1, 3)
    d = found.first
    assert (d.index, d.char, d.token) == (1, at, 3)
    assert d.ours == "…" + base[at - drift.EXCERPT:at + drift.EXCERPT] + "…"
    assert d.theirs.startswith("…" + base[at - drift.EXCERPT:at] + "sleepy")
    assert found.describe() == f"1 of 3 identical; prompt 1 first diverged at character {at}, token 3: " \
        f"{d.ours!r} here, {d.theirs!r} there"


def test_without_token_ids_on_either_side_the_character_alone_is_named() -> None:
    found = drift.compare((Output("abc", (1, 2)),), (Output("abd"),))
    assert (found.first.char, found.first.token, found.first.ours, found.first.theirs) == (2, None, "abc", "abd")
    assert drift.compare((Output("ab"),), (Output("abc"),)).first.char == 2  # one ends first: where it ended


# (case, the candidate's fields, whether it is the baseline of run 9 of stack `a`)
BASELINES = [
    ("new-image", {"image": "sha256:" + "b" * 64}, True),
    ("new-patch-set", {"patches": "p2"}, True),
    ("new-draft", {"draft": "d1"}, True),
    ("same-build", {}, False),  # a restart or a flag: no new build
    ("other-weights", {"image": "sha256:" + "b" * 64, "model": "beef"}, False),
    ("other-stack", {"image": "sha256:" + "b" * 64, "stack": "b"}, False),
    ("newer", {"image": "sha256:" + "b" * 64, "id": 10}, False),
]


@pytest.mark.parametrize(("fields", "chosen"), [c[1:] for c in BASELINES], ids=[c[0] for c in BASELINES])
def test_the_baseline_is_the_last_passing_new_build_of_the_same_weights(fields: dict, chosen: bool) -> None:
    fields = dict(fields)
    candidate = run(fields.pop("id", 3), stack=fields.pop("stack", "a"), **fields)
    assert (drift.baseline(run(9), [candidate]) == candidate) is chosen


def test_the_newest_of_several_new_builds_is_the_baseline() -> None:
    older, newer = run(2, image="sha256:1"), run(5, image="sha256:2")
    assert drift.baseline(run(9), [newer, older, run(4)]) == newer


# (case, the candidate's fields, whether it is the twin of speculative run 9 of stack `a-spec`)
TWINS = [
    ("no-spec-same-weights", {}, True),
    ("no-spec-other-image", {"image": "sha256:" + "b" * 64}, True),  # the same target, whatever serves it
    ("speculative", {"speculative": True}, False),
    ("other-commit", {"model": "beef"}, False),
    ("same-stack", {"stack": "a-spec"}, False),
]


@pytest.mark.parametrize(("fields", "chosen"), [c[1:] for c in TWINS], ids=[c[0] for c in TWINS])
def test_the_twin_is_another_stack_without_speculation_on_the_same_model_and_commit(fields: dict,
                                                                                   chosen: bool) -> None:
    fields = dict(fields)
    candidate = run(3, stack=fields.pop("stack", "a"), speculative=fields.pop("speculative", False), **fields)
    assert (drift.twin(run(9, stack="a-spec", speculative=True), [candidate]) == candidate) is chosen
    assert drift.twin(run(9, stack="a-plain"), [candidate]) is None  # only a speculative stack has a twin


def outputs(identical: int, total: int = 4) -> tuple[Output, ...]:
    return tuple(Output("same" if i < identical else f"other {i}") for i in range(total))


def reviewed(ours: int, theirs: int) -> drift.Drift:
    """Speculative run 9, `ours` of 4 outputs identical to its last build's, `theirs` to its twin's."""
    return drift.review(run(9, outputs(4), stack="a-spec", speculative=True),
                        [run(5, outputs(ours), stack="a-spec", speculative=True, patches="p0"),
                         run(4, outputs(theirs), stack="a")])


def test_drift_is_reported_and_passed_where_the_stack_asks_no_gate() -> None:
    found = drift.judged(reviewed(1, 2), Drift())
    assert found.verdict.passed
    assert found.lines[0].startswith("greedy outputs against a-spec's run 5 (patch set p0 -> p1): 1 of 4 identical")
    assert found.lines[1].startswith("drifted from its no-spec twin a (run 4): 2 of 4 identical; prompt 2 first ")


# (case, identical to the last build, to the twin, min_identical, the words of each reason)
GATES = [
    ("all-identical", 4, 4, 1.0, []),
    ("build-drifted", 3, 4, 1.0, ["3 of 4 greedy outputs identical to the last passing build (run 5), under the "
                                  "100% asked (expectations.drift.min_identical)"]),
    ("twin-drifted", 4, 1, 0.5, ["1 of 4 greedy outputs identical to the no-spec twin a (run 4), under the 50%"]),
    ("within-the-share", 3, 3, 0.75, []),
    ("both", 0, 0, 0.5, ["to the last passing build", "to the no-spec twin a"]),
]


@pytest.mark.parametrize(("ours", "theirs", "share", "words"), [c[1:] for c in GATES], ids=[c[0] for c in GATES])
def test_the_gate_refuses_under_min_identical(ours: int, theirs: int, share: float, words: list[str]) -> None:
    verdict = drift.judged(reviewed(ours, theirs), Drift(gate=True, min_identical=share)).verdict
    assert len(verdict.reasons) == len(words), verdict.reasons
    for reason, word in zip(verdict.reasons, words, strict=True):
        assert word in reason, reason


def test_a_first_run_has_nothing_to_compare_and_passes_any_gate() -> None:
    found = drift.judged(drift.review(run(9, outputs(4), speculative=True, stack="s"), []), Drift(gate=True))
    assert found.verdict.passed and (found.build, found.twin) == (None, None)
    assert found.lines == ("greedy outputs of 4 prompts stored (run 9): no earlier passing build of s on the same "
                           "weights to compare with", "no no-spec twin on org/m at commit c0ffee has greedy outputs "
                           "to compare with")


def test_the_prompt_set_is_shipped_and_its_key_names_what_was_asked() -> None:
    shipped = drift.shipped()
    assert len(shipped.texts) == 16 and len(set(shipped.texts)) == 16
    assert (shipped.max_tokens, shipped.seed) == (drift.MAX_TOKENS, drift.SEED)
    keys = {shipped.key, drift.Prompts(shipped.texts[1:]).key, drift.Prompts(shipped.texts, max_tokens=64).key,
            drift.Prompts(shipped.texts, seed=1).key}
    assert len(keys) == 4 and shipped.key == drift.shipped().key


def test_the_reports_section_reads_each_stacks_newest_run(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    for parts, texts, verdict in ((PARTS, ["x", "y"], "pass"), (PARTS | {"patches": "p2"}, ["x", "z"], "pass"),
                                  (PARTS | {"patches": "p3"}, ["w", "z"], "fail: 0 of 2 (run 3)")):
        made = store.deployments.begin("a")
        store.deployments.advance(made, Phase.RUNNING)
        greedy = store.greedy.record("a", "fp", parts, model="org/m", speculative=False, prompts="k",
                                     outputs=[Output(t) for t in texts])
        store.greedy.judge(greedy, verdict)
    assert report.section(store, ["a", "b"]) == [
        "## Greedy drift (temperature 0, sparkctl's fixed prompts)", "",
        "- a: greedy outputs against a's run 2 (patch set p2 -> p3): 1 of 2 identical; prompt 0 first diverged at "
        "character 0: 'w' here, 'x' there",
        "- a: refused by its drift gate: 0 of 2 (run 3)", ""]
    assert report.section(store, ["b"]) == []


def test_the_comparison_report_ends_with_the_greedy_drift_section(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    entries = seed_study(store)
    name = entries[0][0].name
    greedy = store.greedy.record(name, "fp", PARTS, model="org/m", speculative=False, prompts="k",
                                 outputs=[Output("x"), Output("y")])
    store.greedy.judge(greedy, "pass")
    path = comparison.compare(entries, Settings(state_dir=tmp_path / "state"), store, folder=tmp_path / "out")
    assert path.read_text().endswith(
        f"\n## Greedy drift (temperature 0, sparkctl's fixed prompts)\n\n- {name}: greedy outputs of 2 prompts stored "
        f"(run 1): no earlier passing build of {name} on the same weights to compare with\n")


SPEC = "name: a\nextends: qwen36-nvfp4-stock\nexpectations:\n  drift:\n"
# (case, lines under `drift:`, the key the error names, its words)
SPEC_CASES = [
    ("share-without-gate", "    min_identical: 0.9\n", "expectations.drift", "without `gate: true`"),
    ("unknown-key", "    gate: true\n    identical: 0.9\n", "expectations.drift.identical", "unknown key"),
    ("share-above-one", "    gate: true\n    min_identical: 90\n", "expectations.drift.min_identical",
     "less than or equal to 1"),
    ("gate-not-a-bool", "    gate: sometimes\n", "expectations.drift.gate", "valid boolean"),
]


@pytest.mark.parametrize(("lines", "key", "words"), [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_a_malformed_drift_section_gives_one_clear_line(workspace: Path, cli, lines, key, words) -> None:
    (workspace / "stacks" / "a.yaml").write_text(SPEC + lines)
    code, out, err = cli("stacks", "validate")
    assert code == 1, out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: ") and f": {key}" in err and words in err, err


def test_a_drift_section_loads_and_defaults_to_reporting_only(workspace: Path, cli) -> None:
    (workspace / "stacks" / "a.yaml").write_text(SPEC + "    gate: true\n")
    code, out, err = cli("stacks", "validate")
    assert (code, err) == (0, ""), err
    assert (Drift().gate, Drift().min_identical, Drift(gate=True).min_identical) == (False, 1.0, 1.0)


def test_the_sims_greedy_replies_are_fixed_per_prompt_and_drift_from_token_k(tmp_path: Path) -> None:
    vocab = Vocabulary(write_model(tmp_path, weights=False))
    first, again = vocab.greedy("a prompt", 30), Vocabulary(tmp_path).greedy("a prompt", 30)
    assert first == again and first != vocab.greedy("another prompt", 30)
    drifted = vocab.greedy("a prompt", 30, drift_after=12)
    assert drifted[:12] == first[:12] and all(a[1] != b[1] for a, b in zip(drifted[12:], first[12:], strict=True))
    assert 12 <= Vocabulary.greedy_length("a prompt") <= 40
    assert Faults.parse("drift_after=12").drift_after == 12


def test_token_ids_count_where_both_sides_have_them() -> None:
    same_text = drift.compare((Output("ab", (1, 2)),), (Output("ab", (1, 3)),))
    assert (same_text.identical, same_text.first.char, same_text.first.token) == (0, 2, 1)
    assert drift.compare((Output("ab", (1, 2)),), (Output("ab"),)).identical == 1  # an engine without ids: the text
