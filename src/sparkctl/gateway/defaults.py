"""A stack's request defaults: parameters the gateway adds to each request it proxies to that
stack, unless the client set them (a stack file's `request_defaults`, e.g.
`chat_template_kwargs: {enable_thinking: true}`).

JSON objects merge key by key, and the client's value wins at every level: a default fills a
gap and never overrides. Pure; the `Gateway` (`proxy.py`) applies it to a request's parsed
body once the request is routed, so the defaults are those of the stack that answers (after a
switch, the new one's), and the body is serialized again, with its new length, when forwarded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Body = TypeVar("Body")


def with_defaults(body: Body, defaults: Mapping[str, object]) -> Body:
    """`body` with `defaults` filled in where the client left them out. A body that is not a JSON
    object is returned as it is; so is the same object when there is nothing to add."""
    if not defaults or not isinstance(body, dict):
        return body
    merged = dict(body)
    for key, default in defaults.items():
        given = merged.get(key, _ABSENT)
        if given is _ABSENT:
            merged[key] = default
        elif isinstance(given, dict) and isinstance(default, dict):
            merged[key] = with_defaults(given, default)
    return merged  # type: ignore[return-value]


_ABSENT = object()  # a key the client did not send (a `null` it sent is a value, and wins)
