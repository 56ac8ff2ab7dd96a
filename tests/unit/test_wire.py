"""The API's shared vocabulary: requests checked once, streamed lines decoded back into records."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from sparkctl import results, wire


@pytest.mark.parametrize(("kind", "body", "message"), [
    (wire.UpRequest, [], "JSON object with string fields: stack"),
    (wire.UpRequest, {"stack": 7}, "string fields: stack"),
    (wire.DownRequest, {}, "string fields: stack"),
    (wire.SwitchRequest, {"stack": "b", "alias": ["primary"]}, "`alias` must be a string"),
])
def test_a_bad_request_says_what_is_wrong(kind, body, message) -> None:
    with pytest.raises(wire.BadRequest, match=message):
        wire.parse(kind, body)


def test_requests_take_their_fields_and_defaults_and_ignore_the_rest() -> None:
    assert wire.parse(wire.UpRequest, {"stack": "a", "refresh": 1, "extra": "x"}) == wire.UpRequest("a", True, False)
    assert wire.parse(wire.SwitchRequest, {"stack": "b", "alias": None}) == wire.SwitchRequest("b", "primary")
    assert wire.parse(wire.SwitchRequest, asdict(wire.SwitchRequest("b", "coder"))) == wire.SwitchRequest("b", "coder")


def test_streamed_lines_decode_to_their_records() -> None:
    line = {"seq": 3, "time": 1.0, "kind": "phase", "stack": "a", "phase": "loading", "detail": "weights"}
    assert wire.decode(line) == wire.PhaseChanged("a", "loading", "weights")
    assert wire.decode({"kind": "died", "stack": "a"}) is None  # not one a client's stream carries


@pytest.mark.parametrize("result", [
    results.UpDone("a", "f" * 12, unchanged=False),
    results.DownDone("a", 1),
    results.SwitchDone("primary", "b", "hold/swap", previous="a", timings={"total_s": 1.5}, park="sleep1",
                    held_requests=3, woken=results.WakeDone("b", 1, 0.4, lowest_available=1 << 30)),
    results.SwitchDone("primary", "a", "unchanged", up=results.UpDone("a", "f" * 12, unchanged=True)),
    results.SwitchDone("primary", "g", "fleet blue/green", hosts=("b", "c")),
    results.RouteDone("primary", (results.RouteRule("a", 8192), results.RouteRule("b")), 0.7, 0.9,
                      ("a: fits", "b: fits")),
    results.RouteDone("primary"),
    results.ParkDone("a", "sleep1", "sleep1: fits"),
    results.WakeDone("a", 0, 12.5, killed="under the floor"),
    results.RetestDone("r:1", "a", "sha256:0", True, "pass", 3, 4, rows=({"depth": 0, "tg_tps": 9.0},),
                       lifted=("r:1",)),
], ids=lambda result: type(result).__name__)
def test_each_result_comes_back_typed_through_its_outcome_line(result: results.Done) -> None:
    line = json.loads(json.dumps(wire.Outcome("a", True, result=result).to_json()))
    assert line["result"]["done"] == result.done
    assert wire.decode(line) == wire.Outcome("a", True, result=result)
