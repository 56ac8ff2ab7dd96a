"""HTTP/1.1 over a unix socket: how the CLI asks the daemon's API. A request per connection;
responses are framed by llhttp (httptools, as the gateway's are). Not `http.client`: its
email-parser and ssl imports cost a CLI call about 45 ms (docs/perf.md)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httptools


class Response:
    """A response's status once its head arrived; its body read as it comes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.status, self.done = sock, 0, False
        self._framed = False  # a length or chunks say where the body ends; else the close does
        self._body: list[bytes] = []
        self._parser = httptools.HttpResponseParser(self)
        while not self.status:
            self._feed()

    def chunks(self) -> Iterator[bytes]:
        while True:
            yield from self._body
            self._body.clear()
            if self.done:
                return
            self._feed()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def lines(self) -> Iterator[bytes]:
        pending = b""
        for chunk in self.chunks():
            *whole, pending = (pending + chunk).split(b"\n")
            yield from whole
        if pending:
            yield pending

    def _feed(self) -> None:
        data = self.sock.recv(65536)
        if not data:  # closed: the end of a body sent without a length, else a cut response
            if not self.status or self._framed:
                raise ConnectionError("the connection closed mid-response")
            self.done = True
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise ConnectionError(f"a malformed response: {e}") from None

    # httptools' callbacks
    def on_header(self, name: bytes, _value: bytes) -> None:
        self._framed = self._framed or name.lower() in (b"content-length", b"transfer-encoding")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class UnixHTTP:
    def __init__(self, path: Path, timeout: float) -> None:
        self.path, self.timeout = path, timeout

    def request(self, method: str, target: str, body: dict | None = None) -> Response:
        """Send one request (a JSON body if any); the response holds the connection until its
        `with` block ends. Raises OSError when nothing answers."""
        payload = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                f"Content-Length: {len(payload)}\r\n" + ("Content-Type: application/json\r\n" if payload else "")
                + "\r\n")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self.path))
            sock.sendall(head.encode() + payload)
            return Response(sock)
        except BaseException:
            sock.close()
            raise
