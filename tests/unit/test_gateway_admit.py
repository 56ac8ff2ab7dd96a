"""What the gateway checks when a request's head is complete, before reading its body: the
Host it was reached by (DNS-rebinding protection for a loopback service), the API key
(`Bearer` in any case; on /metrics too when asked), and on the OpenAI routes what a web page
could send: another site's Origin, a body not declared JSON."""

from __future__ import annotations

import pytest

from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.request import Request
from sparkctl.gateway.routes import RouteTable
from sparkctl.settings import Settings

NAMES = Settings(gateway_hostnames=["spark.local"]).gateway_names


def verdict(gateway: Gateway, path: str, method: str = "POST", **headers: str) -> int | None:
    """The status the gateway refuses with, or None if it admits the request (a JSON body unless
    `content_type` says otherwise)."""
    named = {"content-type": "application/json"} | {k.lower().replace("_", "-"): v for k, v in headers.items()}
    refusal = gateway.admit(Request(method, path, named, b""))
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


@pytest.mark.parametrize(("origin", "status"), [
    (None, None),  # an agent: no Origin
    ("http://127.0.0.1:8000", None), ("HTTP://LOCALHOST:8000", None),  # the gateway's own page
    ("http://evil.example", 403), ("http://127.0.0.1:8001", 403),  # another port of loopback is another site
    ("https://127.0.0.1", 403), ("null", 403), ("", 403), ("http://[::1", 403),
])
def test_only_the_gateways_own_origin_may_call_the_openai_routes(origin: str | None, status: int | None) -> None:
    host = "localhost:8000" if origin and "LOCALHOST" in origin else "127.0.0.1:8000"
    extra = {} if origin is None else {"origin": origin}
    for path, method in [("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/v1/models", "GET")]:
        assert verdict(Gateway(RouteTable, hosts=NAMES), path, method, host=host, **extra) == status
    assert verdict(Gateway(RouteTable), "/health", "GET", host=host, **extra) is None  # not an OpenAI route


@pytest.mark.parametrize(("content_type", "status"), [
    ("application/json", None), ("application/json; charset=utf-8", None), ("Application/JSON ;charset=UTF-8", None),
    ("text/plain", 415), ("text/plain; charset=utf-8", 415), ("application/x-www-form-urlencoded", 415),
    ("multipart/form-data; boundary=x", 415), ("", 415), ("application/jsonp", 415), ("text/json", 415),
])
def test_an_openai_post_must_declare_a_json_body(content_type: str, status: int | None) -> None:
    gateway = Gateway(RouteTable)
    assert verdict(gateway, "/v1/chat/completions", host="127.0.0.1:8000", content_type=content_type) == status
    assert verdict(gateway, "/v1/models", "GET", host="127.0.0.1:8000", content_type=content_type) is None
