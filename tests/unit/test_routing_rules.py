"""Routed aliases, the pure part: the rules' checks, the CLI's `STACK:TOKENS` form, which rule a
prompt goes to, their place in desired.yaml (round trip; the bad files are in test_state_files), and the
gateway's prompt count (a prompt routed by its size alone is within the limit in tokens too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.errors import SparkctlError, SpecError
from sparkctl.gateway import tokens
from sparkctl.policy import routing
from sparkctl.policy.routing import Rule
from sparkctl.state import desired
from sparkctl.state.desired import Desired
from tests.fakes.tinymodel import write_model

PAIR = (Rule("qwen36-dflash", 8192), Rule("qwen36-nvfp4-aeon"))


def test_a_prompt_goes_to_the_first_rule_that_holds_it() -> None:
    rules = (Rule("a", 100), Rule("b", 1000), Rule("c"))
    assert [routing.pick(rules, n) for n in (0, 100, 101, 1000, 1001, 10**6)] == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(("rules", "problem"), [
    ((Rule("a"),), "at least two rules"),
    ((Rule("a", 10), Rule("b", 20)), "the last rule takes the rest"),
    ((Rule("a"), Rule("b")), "every rule but the last needs `up_to`"),
    ((Rule("a", 0), Rule("b")), "positive number"),
    ((Rule("a", 20), Rule("b", 10), Rule("c")), "must grow"),
    ((Rule("a", 10), Rule("a")), "a stack appears in two rules"),
])
def test_bad_rules_are_refused_with_what_is_wrong(rules, problem: str) -> None:
    with pytest.raises(SparkctlError, match=problem):
        routing.check("primary", rules)


def test_the_fit_of_each_rule_says_its_kv_cache_and_refuses_a_stack_too_short_for_its_prompts() -> None:
    serving = {"qwen36-dflash": routing.Serving(131072, 113_000), "qwen36-nvfp4-aeon": routing.Serving(131072)}
    assert routing.fit(PAIR, serving) == [
        "qwen36-dflash: KV cache 113,000 tokens, 13.8 prompts of 8,192 tokens at once",
        "qwen36-nvfp4-aeon: KV cache unknown (its deploy recorded none)"]
    with pytest.raises(SparkctlError, match="qwen36-dflash serves at most 4,096 tokens of context, but its rule "
                                            "sends it prompts up to 8,192"):
        routing.fit(PAIR, serving | {"qwen36-dflash": routing.Serving(4096, 50_000)})


def test_the_cli_form_takes_tokens_and_k() -> None:
    assert [routing.parse(t) for t in ("qwen36-dflash:8k", "x:300", "qwen36-nvfp4-aeon")] == [
        Rule("qwen36-dflash", 8192), Rule("x", 300), Rule("qwen36-nvfp4-aeon")]
    with pytest.raises(SparkctlError, match="not a number of tokens"):
        routing.parse("x:lots")


def test_routes_round_trip_in_desired_yaml_and_replace_a_plain_alias(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    wanted = Desired(("qwen36-dflash", "qwen36-nvfp4-aeon"), {"primary": "qwen36-dflash"}).routed("primary", PAIR)
    assert wanted.aliases == {} and wanted.routes == {"primary": PAIR}
    desired.save(path, wanted)
    assert desired.load(path) == wanted
    assert desired.load(path).routed("primary", None).routes == {}


JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


@given(routes=st.dictionaries(st.text(max_size=8), JSONISH, max_size=3))
@settings(max_examples=200, deadline=None)
def test_any_routes_section_loads_or_is_a_spec_error(tmp_path_factory, routes: dict) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "desired.yaml"
    path.write_text(json.dumps({"routes": routes}))  # JSON is YAML
    try:
        loaded = desired.load(path)
    except SpecError as e:
        assert e.file == str(path) and e.key.startswith("routes")
    else:
        for alias, rules in loaded.routes.items():
            assert routing.check(alias, rules) == rules


@pytest.fixture(scope="module")
def counter(tmp_path_factory) -> tokens.PromptCounter:
    return tokens.load(write_model(tmp_path_factory.mktemp("tiny"), weights=False))


@given(text=st.text(max_size=400), limit=st.integers(0, 600))
@settings(max_examples=300, deadline=None)
def test_a_prompt_decided_by_its_size_alone_is_within_the_limit(counter, text: str, limit: int) -> None:
    payload = {"messages": [{"role": "user", "content": text}]}
    found = counter.at_most("/v1/chat/completions", payload, limit)
    exact = counter.count("/v1/chat/completions", payload)
    assert exact <= limit if found is None else found == exact


def test_the_count_renders_the_chat_template_and_falls_back_to_the_text(counter) -> None:
    payload = {"messages": [{"role": "user", "content": "hi"}]}
    assert counter.text("/v1/chat/completions", payload) == ("<|user|>hi\n<|assistant|>", False)
    assert counter.text("/v1/completions", {"prompt": ["a", "b"]}) == ("ab", True)
    broken = tokens.PromptCounter(counter.tokenizer, tokens._compile("{{ raise_exception('no') }}"), {})
    assert broken.text("/v1/chat/completions", payload) == ("hi", False)


def test_route_suggest_proposes_the_seed_crossover_from_the_latest_runs(workspace: Path, cli) -> None:
    """Seed 000's DFlash n=8 and its no-spec twin (calibrated rows): faster through depth 8192,
    slower from 12288; the threshold is the deepest faster test's prompt (8192 + pp 512)."""
    from sparkctl.settings import Settings
    from sparkctl.state.store import Store
    from tests.seedshape import seed_study

    seed_study(Store(Settings().store_path))
    code, out, err = cli("route", "suggest", "qwen36-dflash", "qwen36-nvfp4-aeon")
    said = " ".join(out.split())
    assert code == 0, err + out
    assert "depth 8192: 21.0 vs 8.7" in said and "depth 12288: 7.5 vs 8.6" in said
    assert "suggested: sparkctl route set ALIAS qwen36-dflash:8704 qwen36-nvfp4-aeon" in said
    code, out, err = cli("route", "suggest", "qwen36-dflash", "qwen36-dflash")
    assert code == 1 and "no crossover" in " ".join((out + err).split())
