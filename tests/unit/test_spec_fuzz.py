"""Fuzz the stack loader: whatever the file holds, it loads or is left out with a SpecError naming
it; the loader itself never raises, so one bad file cannot take the catalog down. That includes
values the YAML reader builds (dates, 5,000-digit integers, tags) and what aliases expand to."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkctl.errors import SpecError
from sparkctl.spec.load import load_stacks
from sparkctl.spec.models import Stack
from sparkctl.spec.render import spec_hash

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


# Scalars whose construction fails, or builds what no engine can be given, as the audit found
# them: `2026-13-45` or 4,301 digits made every daemon command answer 500.
dates = st.builds("{:04d}-{:02d}-{:02d}{}".format, st.integers(0, 9999), st.integers(0, 99), st.integers(0, 99),
                  st.sampled_from(["", "T25:61:61Z", "T10:00:00+99:99", " 10:00:00.5"]))
hostile = st.one_of(
    dates,
    st.builds(lambda prefix, digit, n: prefix + digit * n, st.sampled_from(["", "-", "0x", "0o", "0b", "1_"]),
              st.sampled_from(["1", "7"]), st.integers(4_000, 6_000)),
    st.builds(lambda n: "1e" + "9" * n, st.integers(3, 400)),
    st.builds(lambda n: ":".join(["59"] * n), st.integers(2, 3_000)),  # base 60 under %YAML 1.1
    st.builds(lambda tag, text: f"!!{tag} {json.dumps(text)}",
              st.sampled_from(["int", "float", "bool", "timestamp", "binary", "set", "omap", "pairs", "null",
                               "python/object:os.system", "str"]), st.text(max_size=8)),
    st.sampled_from(['"\\0"', '"a\\ud800"', "!local x", "&a [*a]", "&a {k: *a}", "{<<: 3}", "!!omap [a: 1, a: 2]",
                     "{a: 1, a: 2}", "[? [a, b]: c]", "1e999999", ".nan"]),
)
SLOTS = ["vllm: {{port: 8001, extra_args: [{v}]}}", "vllm: {{port: 8001, max_model_len: {v}}}",
         "vllm: {{port: 8001}}\nrequest_defaults: {{x: {v}}}", "vllm: {{port: 8001}}\ncontainer: {{env: {{X: {v}}}}}"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=hostile, slot=st.sampled_from(SLOTS), version=st.sampled_from(["", "%YAML 1.1\n---\n"]))
def test_hostile_values_are_a_spec_error_for_their_file(tmp_path: Path, value: str, slot: str, version: str) -> None:
    """Whatever a value builds, the file loads (and hashes) or is left out naming itself: the
    reader's errors get the same isolation as the schema's."""
    text = f"{version}name: fuzz\nextends: qwen36-base\nabstract: false\nmodel: {{repo: a/b}}\n" + \
        slot.format(v=value) + "\n"
    target = tmp_path / "fuzz.yaml"
    target.write_text(text)
    catalog = load_stacks([ROOT / "stacks" / "qwen36-base.yaml", ROOT / "stacks" / "qwen36-nvfp4-stock.yaml", target])
    assert "qwen36-nvfp4-stock" in catalog.stacks, catalog.invalid
    if "fuzz" in catalog.stacks:
        assert not catalog.invalid and spec_hash(catalog.stacks["fuzz"])
    else:
        [invalid] = catalog.invalid
        assert invalid.file == target and str(invalid.error).startswith(f"{target}: "), invalid
        with pytest.raises(SpecError):
            catalog.stack("fuzz")


def test_aliases_are_bounded_by_the_text_they_expand_to(tmp_path: Path) -> None:
    """The audit's 0.21 MB file of aliases to one long string was hashed as 829 MB by `up` and
    `stacks show`: 4,000 values (well under the bound on their number) of 16,000 characters each.
    Refused as it is read, before anything expands it."""
    target = tmp_path / "fuzz.yaml"
    aliases = ", ".join(["*s"] * 4_000)
    target.write_text(f"name: fuzz\nextends: qwen36-base\nabstract: false\nmodel: {{repo: a/b}}\nvllm: {{port: 8001}}\n"
                      f"request_defaults: {{x: [&s {'a' * 16_000}, {aliases}]}}\n")
    assert target.stat().st_size < 40_000
    tracemalloc.start()
    try:
        catalog = load_stacks([ROOT / "stacks" / "qwen36-base.yaml", target])
        hashes = [spec_hash(stack) for stack in catalog.stacks.values()]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"reading and hashing a {target.stat().st_size}-byte file took {peak >> 20} MiB"
    assert hashes and "fuzz" not in catalog.stacks
    assert str(catalog.invalid[0].error) == (f"{target}: expands to over 1 MiB of text through YAML aliases, more than "
                                             "a sparkctl file may hold; write the values out instead")
