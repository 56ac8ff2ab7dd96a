"""HTTP/1.1 framing shared by both sides of the gateway: message heads and chunked bodies.

Both sides parse bytes as the socket delivers them, in pieces of any size, so every parser here
takes what has arrived and keeps what it cannot use yet.
"""

from __future__ import annotations

from http import HTTPStatus

MAX_HEAD = 64 * 1024
_SIZE, _DATA_END, _TRAILER = -1, 0, -2  # what the next line of a chunked body is, when not chunk data


class Malformed(ValueError):
    """Bytes that are not the HTTP/1.1 the other side should have sent."""


def split_head(buffer: bytes | bytearray) -> tuple[list[str], int] | None:
    """A message head's lines and where the bytes after it start, or None while it is incomplete."""
    end = buffer.find(b"\r\n\r\n", 0, MAX_HEAD + 4)
    if end < 0:
        if len(buffer) > MAX_HEAD:
            raise Malformed("message head over 64 KiB")
        return None
    return buffer[:end].decode("latin-1").split("\r\n"), end + 4


def fields(lines: list[str]) -> list[tuple[str, str]]:
    """Header lines as (name, value) pairs, in order."""
    pairs = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise Malformed(f"malformed header line {line[:40]!r}")
        pairs.append((name, value.strip()))
    return pairs


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


class Dechunker:
    """Decodes a chunked body fed in arbitrary pieces; `rest` holds what follows its end."""

    def __init__(self) -> None:
        self.left = _SIZE  # > 0: bytes left of a chunk's data; else what the next line is
        self.pending = b""  # an incomplete line
        self.ended = False
        self.rest = b""

    def feed(self, data: bytes) -> bytes:
        data = self.pending + data if self.pending else data
        pieces, pos, end, left = [], 0, len(data), self.left
        while pos < end:
            if left > 0:  # inside a chunk's data
                piece = data[pos:pos + left]
                pieces.append(piece)
                pos += len(piece)
                left -= len(piece)
                if left:
                    break
                left = _DATA_END
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                if end - pos > MAX_HEAD:
                    raise Malformed("chunk line over 64 KiB")
                break
            line, pos = data[pos:eol], eol + 2
            if left == _DATA_END:
                if line:
                    raise Malformed("chunk data longer than its size")
                left = _SIZE
            elif left == _SIZE:
                try:
                    size = int(line.partition(b";")[0], 16)
                except ValueError:
                    raise Malformed(f"chunk size {line[:20]!r}") from None
                if size < 0:
                    raise Malformed(f"chunk size {line[:20]!r}")
                left = size or _TRAILER
            elif not line:  # the empty line after the trailers ends the body
                self.ended, self.rest = True, data[pos:]
                pos = end
        self.left = left
        self.pending = b"" if self.ended else data[pos:]
        return b"".join(pieces)
