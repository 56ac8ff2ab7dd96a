"""A header sent twice that a front proxy and sparkctl could each read a different copy of is a 400
(issue 31, finding 9): the gateway kept the last Authorization, so behind a proxy that checks the
first, a wrong key followed by the right one was let in. The daemon's own API refuses two as well.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp.test_utils import TestServer

from sparkctl import messages
from sparkctl.daemon import api
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.request import SINGLE, _problem
from sparkctl.gateway.routes import RouteTable
from tests.conftest import Running

KEY = "sk-right"
# Each header of the class: a value the gateway accepts alone, and another a proxy might have read.
TWICE = {
    "host": ("127.0.0.1", "evil.example"),
    "authorization": (f"Bearer {KEY}", "Bearer sk-wrong"),
    "x-sparkctl-token": ("a", "b"),
    "cookie": ("sparkctl=a", "sparkctl=b"),
    "origin": ("http://x", "http://evil.example"),  # the gateway's own (Host: x), then another site
    "content-length": ("0", "0"),
    "transfer-encoding": ("chunked", "chunked"),
    "content-type": ("application/json", "text/plain"),
    "expect": ("100-continue", "nothing"),
}


def test_every_header_that_must_come_once_is_in_the_table() -> None:
    assert set(TWICE) == set(SINGLE)


@pytest.mark.parametrize("name", TWICE)
def test_a_head_with_two_of_a_single_header_is_a_problem(name: str) -> None:
    first, second = TWICE[name]
    once = [("host", "x"), ("accept", "*/*"), ("accept", "text/plain")] if name != "host" else [("accept", "*/*")]
    for fields in (once + [(name, first), (name, second)], [(name, first), *once, (name, first)]):
        problem = _problem("1.1", "/v1/models", dict(fields), [n for n, _ in fields])
        assert problem == f"more than one {name.title()} header: send it once"
    assert _problem("1.1", "/v1/models", dict(once + [(name, first)]), [n for n, _ in once] + [name]) == ""


@pytest.fixture(scope="module")
def gateway() -> Running:
    running = Running(Gateway(lambda: RouteTable(), api_keys=[KEY]))
    yield running
    running.stop()


def ask(running: Running, head: list[tuple[str, str]], body: bytes = b"") -> bytes:
    """The status line the gateway answers `GET /v1/models` with, sent as raw bytes."""
    lines = "".join(f"{name}: {value}\r\n" for name, value in head)
    with socket.create_connection(("127.0.0.1", running.port), timeout=10) as sock:
        sock.sendall(f"GET /v1/models HTTP/1.1\r\n{lines}Connection: close\r\n\r\n".encode() + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer.partition(b"\r\n")[0]


def test_a_wrong_key_then_the_right_one_is_refused_at_the_wire(gateway: Running) -> None:
    right, wrong = ("Authorization", f"Bearer {KEY}"), ("authorization", "Bearer sk-wrong")
    assert ask(gateway, [("Host", "x"), right]) == b"HTTP/1.1 200 OK"
    assert ask(gateway, [("Host", "x"), wrong]) == b"HTTP/1.1 401 Unauthorized"
    assert ask(gateway, [("Host", "x"), wrong, right]) == b"HTTP/1.1 400 Bad Request"
    assert ask(gateway, [("Host", "x"), right, ("AUTHORIZATION", "Bearer sk-wrong")]) == b"HTTP/1.1 400 Bad Request"
    assert ask(gateway, [("Host", "x"), right, right]) == b"HTTP/1.1 400 Bad Request"


@pytest.mark.parametrize("name", TWICE)
def test_each_header_sent_twice_is_a_400_at_the_wire(gateway: Running, name: str) -> None:
    first, second = TWICE[name]
    head = [(n, v) for n, v in (("Host", "x"), ("Authorization", f"Bearer {KEY}")) if n.lower() != name]
    framed = b"0\r\n\r\n" if name == "transfer-encoding" else b""
    assert ask(gateway, [*head, (name, first)], framed).startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 100 "))
    assert ask(gateway, [*head, (name.title(), first), (name, second)], framed) == b"HTTP/1.1 400 Bad Request"


class Reads:
    def status(self) -> messages.Status:
        return messages.Status((), {})


@pytest.mark.parametrize(("given", "status"), [
    ([("Authorization", "Bearer t")], 200),
    ([("Authorization", "Bearer no")], 401),
    ([("Authorization", "Bearer t"), ("Authorization", "Bearer no")], 400),
    ([("Authorization", "Bearer no"), ("authorization", "Bearer t")], 400),
    ([("Authorization", "Bearer t"), ("Authorization", "Bearer t")], 400),
])
def test_the_daemon_api_refuses_two_authorization_headers(given: list[tuple[str, str]], status: int) -> None:
    """Sent as raw bytes: aiohttp's client would merge two names that differ only in case."""
    lines = "".join(f"{name}: {value}\r\n" for name, value in given)

    async def main() -> bytes:
        async with TestServer(api.build(object(), Reads(), token="t")) as server:  # type: ignore[arg-type]
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(f"GET /v1/status HTTP/1.1\r\nHost: x\r\n{lines}Connection: close\r\n\r\n".encode())
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            await writer.wait_closed()
            return answer

    assert asyncio.run(main()).startswith(b"HTTP/1.1 %d " % status)
