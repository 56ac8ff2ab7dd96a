"""Fuzz the stack loader: whatever the file holds, it loads or is left out with a SpecError naming
it; the loader itself never raises, so one bad file cannot take the catalog down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkctl.errors import SpecError
from sparkctl.spec.load import load_stacks
from sparkctl.spec.models import Stack

ROOT = Path(__file__).resolve().parents[2]
KEYS = sorted(Stack.model_fields) + ["repository", "tag", "repo", "port", "speculative", "method",
                                     "num_speculative_tokens", "gpu_memory_utilization", "x"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 300_000), st.floats(allow_nan=False),
                    st.text(max_size=12), st.sampled_from(["qwen36-base", "qwen36-dflash", "latest", "dflash"]))
values = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.dictionaries(st.sampled_from(KEYS), kids, max_size=4)), max_leaves=12)
documents = st.dictionaries(st.sampled_from(KEYS), values, max_size=8)


def _load(tmp: Path, text: str) -> list[SpecError]:
    base = ROOT / "stacks" / "qwen36-base.yaml"
    target = tmp / "fuzz.yaml"
    target.write_text(text)
    catalog = load_stacks([base, target])
    errors = [i.error for i in catalog.invalid]
    for e in errors:
        assert str(e).startswith(str(target)) or str(e).startswith(str(base)), e
    for name in catalog.files:
        try:
            catalog.stack(name)
        except SpecError as e:  # abstract, or left out with the error above
            assert "no such stack" in str(e) or str(e) in {str(x) for x in errors}, e
    return errors


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=documents)
def test_structured_documents(tmp_path: Path, doc: dict) -> None:
    # JSON is YAML: this writes any structure, typed as generated.
    _load(tmp_path, json.dumps(doc, default=str))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_arbitrary_text(tmp_path: Path, text: str) -> None:
    _load(tmp_path, text)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drop=st.sets(st.sampled_from(["image", "model", "vllm", "name", "extends"])),
       extra=st.dictionaries(st.sampled_from(KEYS), values, max_size=3))
def test_mutated_real_stack(tmp_path: Path, drop: set, extra: dict) -> None:
    doc = {"name": "m", "extends": "qwen36-base", "abstract": False,
           "image": {"repository": "vllm/vllm-openai", "tag": "v0.24.0"},
           "model": {"repo": "a/b"}, "vllm": {"port": 8001}}
    doc = {k: v for k, v in doc.items() if k not in drop} | extra
    _load(tmp_path, json.dumps(doc, default=str))


@pytest.mark.parametrize("depth", [10, 2_000, 30_000])
@pytest.mark.parametrize(("opener", "closer"), [("[", "]"), ("{a: ", "}"), ("- ", "")])
def test_nesting_of_any_depth_is_a_spec_error_or_loads(tmp_path: Path, depth: int, opener: str,
                                                       closer: str) -> None:
    """~30,000 nested `[` crashed the C parser (and with it the daemon); it is an error now."""
    _load(tmp_path, f"name: fuzz\nextends: qwen36-base\nx: {opener * depth}1{closer * depth}\n")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(levels=st.integers(1, 12), width=st.integers(1, 12))
def test_alias_expansion_is_bounded(tmp_path: Path, levels: int, width: int) -> None:
    """A 600-byte file of aliases once took minutes to show and gigabytes to render."""
    lines = ["name: fuzz", "extends: qwen36-base", f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    errors = _load(tmp_path, "\n".join(lines) + "\n")
    assert all(str(e).startswith(str(tmp_path / "fuzz.yaml")) for e in errors), errors
    if width ** levels > 100_000:
        assert [e for e in errors if "YAML aliases" in str(e)], errors
