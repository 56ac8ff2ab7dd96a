"""The API's messages: requests checked once, streamed lines and answers decoded back into records by one decoder."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from sparkctl import messages


@pytest.mark.parametrize(("kind", "body", "message"), [
    (messages.UpRequest, [], "JSON object with string fields: stack"),
    (messages.UpRequest, {"stack": 7}, "string fields: stack"),
    (messages.DownRequest, {}, "string fields: stack"),
    (messages.SwitchRequest, {"stack": "b", "alias": ["primary"]}, "`alias` must be a string"),
    (messages.BenchRequest, {"stack": "a", "runs": "2"}, "`runs` must be a number"),
    (messages.BenchRequest, {"stack": "a", "temperature": True}, "`temperature` must be a number"),
    (messages.ImageEdit, {"edit": "ban", "ref": "r:1"}, "`edit` must be one of pin, unpin, blacklist"),
])
def test_a_bad_request_says_what_is_wrong(kind, body, message) -> None:
    with pytest.raises(messages.BadRequest, match=message):
        messages.parse(kind, body)


def test_requests_take_their_fields_and_defaults_and_ignore_the_rest() -> None:
    parse, up, switch = messages.parse, messages.UpRequest, messages.SwitchRequest
    assert parse(up, {"stack": "a", "refresh": 1, "extra": "x"}) == up("a", True, False)
    assert parse(switch, {"stack": "b", "alias": None}) == switch("b", "primary")
    assert parse(switch, asdict(switch("b", "coder"))) == switch("b", "coder")
    bench = messages.BenchRequest
    assert parse(bench, {"stack": "a", "runs": 2, "temperature": 1.0}) == bench("a", runs=2, temperature=1.0)
    assert parse(bench, {"stack": "a", "runs": None}) == bench("a")


def test_streamed_lines_decode_to_their_records() -> None:
    line = {"seq": 3, "time": 1.0, "kind": "phase", "stack": "a", "phase": "loading", "detail": "weights"}
    assert messages.decode(line) == messages.PhaseChanged("a", "loading", "weights")
    assert messages.decode({"kind": "died", "stack": "a"}) is None  # not one a client's stream carries


@pytest.mark.parametrize("result", [
    messages.UpDone("a", "f" * 12, unchanged=False),
    messages.DownDone("a", 1),
    messages.SwitchDone("primary", "b", "hold/swap", previous="a", timings={"total_s": 1.5}, park="sleep1",
                    held_requests=3, woken=messages.WakeDone("b", 1, 0.4, lowest_available=1 << 30)),
    messages.SwitchDone("primary", "a", "unchanged", up=messages.UpDone("a", "f" * 12, unchanged=True)),
    messages.SwitchDone("primary", "g", "fleet blue/green", hosts=("b", "c")),
    messages.RouteDone("primary", (messages.RouteRule("a", 8192), messages.RouteRule("b")), 0.7, 0.9,
                      ("a: fits", "b: fits")),
    messages.RouteDone("primary"),
    messages.ParkDone("a", "sleep1", "sleep1: fits"),
    messages.WakeDone("a", 0, 12.5, killed="under the floor"),
    messages.RetestDone("r:1", "a", "sha256:0", True, "pass", 3, 4, rows=({"depth": 0, "tg_tps": 9.0},),
                       lifted=("r:1",)),
    messages.BenchDone("a", 3, "quick", "/s/bench/3", False, "fail: decode 9.0 < 10", ({"depth": 0},)),
    messages.PatchChecked("a", 3, "0123abcd", "/v/vllm", "--- image:x\n+++ patched:x\n"),
    messages.PatchChecked("a"),
    messages.ImageEdited("pin", "r:1", "sha256:0"),
], ids=lambda result: type(result).__name__)
def test_each_result_comes_back_typed_through_its_outcome_line(result: messages.Done) -> None:
    line = json.loads(json.dumps(messages.Outcome("a", True, result=result).to_json()))
    assert line["result"]["done"] == result.done
    assert messages.decode(line) == messages.Outcome("a", True, result=result)


def test_the_desired_state_comes_back_typed_to_its_route_rules() -> None:
    desired = messages.DesiredState(("a", "b"), {"primary": "a"}, {}, {"b": 1},
                                    {"long": (messages.RouteRule("a", 8192), messages.RouteRule("b"))})
    assert messages.load(messages.DesiredState, json.loads(json.dumps(asdict(desired)))) == desired


def test_a_status_answer_comes_back_typed_to_its_nested_rows() -> None:
    kv = messages.KvRow(1000, 4096, 8, 900, 0.25, "fits", warnings=("short",))
    row = messages.StatusRow("a", "healthy", "running", "http://127.0.0.1:8001", "f" * 12, "c", 5, 0.3, None, kv)
    status = messages.Status((row,), {"other": ["x"]}, memory=messages.MemoryHeld({"a": 0.3}, 0.9, {}), catalog=("a",))
    assert messages.load(messages.Status, json.loads(json.dumps(asdict(status)))) == status
