"""The CLI's HTTP over unix sockets (`unixhttp`): bodies with a length, chunked, or ended by the
close, split anywhere on the wire; NDJSON lines as they come; a cut or malformed response is an
error, never a short answer taken for a whole one."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkctl.cli.client import UnixHTTP


def serve_once(path: Path, pieces: list[bytes]) -> threading.Thread:
    """A server that reads one request's head, then sends `pieces` one send at a time, and closes."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)

    def run() -> None:
        conn, _ = server.accept()
        with conn, server:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            for piece in pieces:
                conn.sendall(piece)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]


def chunked(lines: list[bytes]) -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(line), line) for line in lines)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b), max_size=6),
       cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_ndjson_lines_arrive_whole_however_the_wire_splits_them(tmp_path_factory, events, cuts) -> None:
    path = tmp_path_factory.mktemp("s") / "api.sock"
    wire = chunked([e + b"\n" for e in events])
    thread = serve_once(path, split(wire, cuts))
    with UnixHTTP(path, 5).request("POST", "/v1/up", {"stack": "x"}) as response:
        assert response.status == 200 and list(response.lines()) == events
    thread.join(5)


@pytest.mark.parametrize("head", [b"Content-Length: 11\r\n", b""])  # with a length, or ended by the close
def test_a_body_with_a_length_or_ended_by_the_close(tmp_path: Path, head: bytes) -> None:
    serve_once(tmp_path / "s", [b"HTTP/1.1 404 Not Found\r\n" + head + b"\r\n", b'{"a": 1}', b"\n\n\n"])
    with UnixHTTP(tmp_path / "s", 5).request("GET", "/containers/x/json") as response:
        assert (response.status, response.read()) == (404, b'{"a": 1}\n\n\n')


@pytest.mark.parametrize("pieces", [[b"HTTP/1.1 200 OK\r\nContent-Le"],  # cut in the head
                                    [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"],  # cut in the body
                                    [b"SMTP ready\r\n\r\n"]])  # not HTTP
def test_a_cut_or_malformed_response_is_an_error(tmp_path: Path, pieces: list[bytes]) -> None:
    serve_once(tmp_path / "s", pieces)
    with pytest.raises(ConnectionError):
        with UnixHTTP(tmp_path / "s", 5).request("GET", "/") as response:
            response.read()
