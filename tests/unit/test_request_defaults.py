"""What the gateway takes from a stack file: request defaults merged into each request (the
client's keys win at every level), and a concurrency cap enforced only when its known issue
has a source or is opted into with `enforce: true`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.daemon.routes import upstream_of
from sparkctl.gateway.defaults import with_defaults
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, build_table
from sparkctl.spec.load import load_catalog
from sparkctl.spec.models import Stack

ROOT = Path(__file__).resolve().parents[2]
CATALOG = load_catalog(ROOT / "stacks", ROOT / "patches")
THINK = {"chat_template_kwargs": {"enable_thinking": True, "effort": "high"}, "temperature": 0.6}


@pytest.mark.parametrize(("body", "defaults", "merged"), [
    ({"model": "m"}, THINK, {"model": "m", **THINK}),
    ({"model": "m", "temperature": 0}, THINK, {"model": "m", "temperature": 0,
                                               "chat_template_kwargs": THINK["chat_template_kwargs"]}),
    ({"chat_template_kwargs": {"enable_thinking": False}}, THINK,  # nested: key by key, the client's win
     {"chat_template_kwargs": {"enable_thinking": False, "effort": "high"}, "temperature": 0.6}),
    ({"chat_template_kwargs": None}, THINK, {"chat_template_kwargs": None, "temperature": 0.6}),  # null is set
    ({"chat_template_kwargs": "raw"}, THINK, {"chat_template_kwargs": "raw", "temperature": 0.6}),
    ({"a": {"b": {"c": 1}}}, {"a": {"b": {"c": 2, "d": 3}, "e": []}}, {"a": {"b": {"c": 1, "d": 3}, "e": []}}),
    ({"stop": ["x"]}, {"stop": ["y", "z"]}, {"stop": ["x"]}),  # lists are values: never merged
    ({"model": "m"}, {}, {"model": "m"}),
])
def test_the_clients_keys_win_at_every_level(body: dict, defaults: dict, merged: dict) -> None:
    before = json.dumps(body)
    assert with_defaults(body, defaults) == merged
    assert json.dumps(body) == before  # the client's body is not changed in place


@pytest.mark.parametrize("body", [["model"], "text", 3, None, True])
def test_a_body_that_is_not_an_object_is_left_as_it_is(body: object) -> None:
    assert with_defaults(body, THINK) is body


def test_no_defaults_is_the_same_body() -> None:
    body = {"model": "m"}
    assert with_defaults(body, {}) is body


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=4)),
    lambda kids: st.one_of(st.lists(kids, max_size=3), st.dictionaries(st.sampled_from("abcd"), kids, max_size=3)),
    max_leaves=10)
objects = st.dictionaries(st.sampled_from("abcd"), json_values, max_size=4)


@settings(max_examples=300, deadline=None)
@given(body=objects, defaults=objects)
def test_merge_properties(body: dict, defaults: dict) -> None:
    merged = with_defaults(body, defaults)
    _client_wins(body, merged)
    assert set(merged) == set(body) | set(defaults)
    assert with_defaults(merged, defaults) == merged  # applying again adds nothing
    assert json.loads(json.dumps(merged)) == merged  # still JSON


def _client_wins(body: dict, merged: dict) -> None:
    for key, value in body.items():
        if isinstance(value, dict) and isinstance(merged[key], dict):
            _client_wins(value, merged[key])
        else:
            assert merged[key] == value


def _stack(**changes: object) -> Stack:
    base = CATALOG.stack("qwen36-nvfp4-stock").model_dump(by_alias=True, exclude_defaults=True)
    return Stack.model_validate(base | changes)


@pytest.mark.parametrize(("issue", "cap"), [
    ({"text": "hangs at 2+", "max_concurrency": 1}, None),  # unsourced: advice only
    ({"text": "hangs at 2+", "max_concurrency": 1, "source": "seed 003:41"}, 1),
    ({"text": "hangs at 2+", "max_concurrency": 2, "source": "https://github.com/vllm-project/vllm/issues/1"}, 2),
    ({"text": "hangs at 2+", "max_concurrency": 1, "source": "measured run 12"}, 1),
    ({"text": "hangs at 2+", "max_concurrency": 1, "enforce": True}, 1),  # the user opted in
    ({"text": "no cap here", "source": "seed 003:41"}, None),
])
def test_the_gateway_enforces_only_sourced_or_opted_in_caps(issue: dict, cap: int | None) -> None:
    stack = _stack(known_issues=[issue])
    table = build_table(aliases={}, stacks={stack.name: upstream_of(stack)}, running={stack.name})
    upstream = table.resolve(stack.name)
    assert upstream.max_concurrency == cap
    gateway = Gateway(lambda: RouteTable())
    taken = [gateway.replicas.take(upstream) for _ in range(3)]  # forwarded at once, or queued (None)
    assert taken.count(None) == (0 if cap is None else 3 - cap)


def test_the_route_table_carries_a_stacks_request_defaults() -> None:
    stack = _stack(request_defaults=THINK)
    table = build_table(aliases={"primary": stack.name}, stacks={stack.name: upstream_of(stack)}, running={stack.name})
    assert table.resolve("primary").request_defaults == THINK
    assert table.resolve("primary").url == f"http://127.0.0.1:{stack.port}"
