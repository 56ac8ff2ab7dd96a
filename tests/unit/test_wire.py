"""The API's shared vocabulary: requests checked once, streamed lines decoded back into records."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from sparkctl import wire


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
    assert wire.decode({"kind": "outcome", "stack": "a", "ok": True, "result": {"x": 1}}) == \
        wire.Outcome("a", True, result={"x": 1})
    assert wire.decode({"kind": "died", "stack": "a"}) is None  # not one a client's stream carries
