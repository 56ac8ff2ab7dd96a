"""What the gateway checks when a request's head is complete, before reading its body: the
Host it was reached by (DNS-rebinding protection for a loopback service) and the API key
(`Bearer` in any case; on /metrics too when asked)."""

from __future__ import annotations

import pytest

from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.request import Request
from sparkctl.gateway.routes import RouteTable
from sparkctl.settings import Settings

NAMES = Settings(gateway_hostnames=["spark.local"]).gateway_names


def verdict(gateway: Gateway, path: str, **headers: str) -> int | None:
    """The status the gateway refuses with, or None if it admits the request."""
    refusal = gateway.admit(Request("POST", path, {k.lower(): v for k, v in headers.items()}, b""))
    if refusal is None:
        return None
    sent: list[int] = []

    class Conn:
        def reply_json(self, status: int, data: object, headers=()) -> None:
            sent.append(status)

    refusal(Conn())  # type: ignore[arg-type]
    return sent[0]


@pytest.mark.parametrize(("host", "admitted"), [
    ("127.0.0.1:8000", True), ("localhost:8000", True), ("[::1]:8000", True), ("spark.local:8000", True),
    ("LOCALHOST", True), ("evil.example:8000", False), ("127.0.0.1.evil.example", False), ("", False),
])
def test_only_the_gateways_own_names_are_admitted(host: str, admitted: bool) -> None:
    gateway = Gateway(RouteTable, hosts=NAMES)
    assert (verdict(gateway, "/v1/models", host=host) is None) is admitted


@pytest.mark.parametrize(("authorization", "admitted"), [
    ("Bearer sk-1", True), ("bearer sk-1", True), ("BEARER  sk-1", True), ("Bearer sk-2", False),
    ("Basic sk-1", False), ("sk-1", False), ("Bearer s\xe9", False), ("", False),
])
def test_the_key_is_checked_case_insensitively(authorization: str, admitted: bool) -> None:
    gateway = Gateway(RouteTable, api_keys=["sk-1"])
    assert verdict(gateway, "/v1/chat/completions", host="x", authorization=authorization) == (None if admitted
                                                                                                 else 401)


def test_metrics_need_the_key_only_when_asked() -> None:
    assert verdict(Gateway(RouteTable, api_keys=["sk-1"]), "/metrics", host="x") is None
    assert verdict(Gateway(RouteTable, api_keys=["sk-1"], metrics_key=True), "/metrics", host="x") == 401
