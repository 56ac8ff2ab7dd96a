"""HTTP/1.1 as the gateway writes it to its clients: a response's head and a body's chunks.
Everything the gateway reads is framed by llhttp (httptools): a client's request in `request.py`,
an engine's answer in `upstream.py`."""

from __future__ import annotations

from http import HTTPStatus


def response_head(status: int, headers: list[tuple[str, str]]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = ""
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(piece: bytes, last: bool = False) -> bytes:
    """`piece` framed as one chunk; `last` adds the end of the body."""
    framed = b"%x\r\n%s\r\n" % (len(piece), piece) if piece else b""
    return framed + b"0\r\n\r\n" if last else framed
