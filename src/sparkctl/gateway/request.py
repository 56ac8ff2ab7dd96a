"""A client's request, and how it is read off a connection's bytes.

Framing is llhttp's (through httptools), which refuses what a front proxy could read another
way: conflicting Content-Lengths, Transfer-Encodings other than chunked, loose chunk sizes,
control characters in header values. On top of it the reader requires Host on HTTP/1.1, refuses
a second copy of any header that a front proxy and the gateway could each read a different copy
of (`SINGLE`: a proxy that checked the first Authorization must not pass on a request whose last
one is what counts here), caps each body and charges the bytes it holds to the server's shared
budget (`Limits`), and asks `admit` about each request as soon as its head is complete, so a
request without a valid API key is refused before any of its body is read. Each `Connection`
(`server.py`) owns a reader and is handed each complete request, or the answer that refuses one,
from inside the socket's callback.

What a request holds while it is read is what is counted: the body in one buffer (a body of
2-byte chunks kept as a bytes object each cost ~25x its size), charged to the budget from its
first byte until its answer is written (queued behind others on the connection included), and
the head capped at `MAX_HEAD`, counted as llhttp hands it over (its line lengths as sent), and
because httptools keeps an unfinished header line to itself, the parser is fed in slices and
the bytes it has read since the body last grew are checked between them. The parser stops
between slices while its connection wants no more requests (its write side is paused, or enough
wait to be answered): what it was not given is kept (`rest`, at most one socket read) and given
once the connection wants more, so a client that pipelines and never reads holds a bounded
amount. The buffers are dropped the moment the connection closes, and the reader's link back to
its connection is weak, so that a closed connection, with the requests queued on it, is freed at
once rather than when the garbage collector next finds the cycle.

HEAD is answered as its route answers GET (`AS_GET`), without the body (the connection writes
none). A request asking for a protocol upgrade is answered as HTTP/1.1 and its connection then
closed: llhttp reads no body on such a request, so one that announces a body is a 400.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httptools

if TYPE_CHECKING:
    from sparkctl.gateway.limits import Limits
    from sparkctl.gateway.server import Connection

MAX_BODY = 32 * 1024 * 1024
MAX_HEAD = 32 * 1024  # a request's head; also what may be read between two pieces of its body
MAX_FIELDS = 100  # header (and trailer) lines of one request
SLICE = 8 * 1024  # the most the parser reads before the bytes it holds are checked
AS_GET = ("GET", "HEAD")  # what a route that answers GET answers: HEAD gets the same head, without the body
# Headers that must come once: the credentials, what the dashboard's checks read, how the body is framed and read.
SINGLE = ("host", "authorization", "x-sparkctl-token", "cookie", "origin", "content-length", "transfer-encoding",
          "content-type", "expect")


@dataclass(slots=True)
class Request:
    method: str
    path: str  # without the query string
    headers: dict[str, str]  # names in lower case
    body: bytes
    keep_alive: bool = True  # whether the connection stays open after its answer
    query: str = ""  # after the `?`, as sent


Answer = Callable[["Connection"], None]  # writes one response
# Asked once a request's head is complete: an answer refuses it before its body is read.
Admit = Callable[[Request], Answer | None]


class RequestReader:
    """One connection's requests, parsed as its bytes arrive: llhttp calls the `on_*` methods
    from inside `feed`."""

    def __init__(self, conn: Connection, admit: Admit | None, limits: Limits) -> None:
        self.conn: Connection = weakref.proxy(conn)  # which owns this reader
        self.admit, self.limits = admit, limits
        self.parser = httptools.HttpRequestParser(self)
        self.incoming: Request | None = None  # being parsed
        self.url = b""  # its target so far
        self.fields: list[tuple[str, str]] = []  # its header lines
        self.headed = False  # whether its head is complete
        self.body = bytearray()  # its body so far, charged to the shared budget
        self.head = 0  # bytes of its head so far, as llhttp hands them over
        self.stalled = 0  # bytes read since its body last grew, or the last request ended
        self.advanced = False  # whether either happened in the slice being parsed
        self.rest = memoryview(b"")  # read from the socket, not yet given to the parser
        self.parsing = False  # inside `parse`

    def feed(self, data: bytes) -> None:
        """Bytes read from the socket: parsed while the connection wants more requests, else kept."""
        self.rest = memoryview(bytes(self.rest) + data if self.rest else data)
        self.parse()

    def parse(self) -> None:
        """Give the parser what is kept, a slice at a time, until the connection wants no more
        (not again from inside its own callbacks: the loop here goes on once they return)."""
        if self.parsing:
            return
        self.parsing = True
        try:
            while self.rest and self.conn.wants_requests():
                piece, self.rest = self.rest[:SLICE], self.rest[SLICE:]
                self._feed(piece)
        except _Refused:
            pass
        except httptools.HttpParserUpgrade:  # the upgrade request was answered as HTTP/1.1; it closes after
            self.rest = memoryview(b"")
        except httptools.HttpParserError as e:
            if self.conn.refusal is None:
                self.conn.refuse(_text(400, f"malformed request: {e}\n"))
        finally:
            self.parsing = False
            if not self.rest:  # an empty slice of the socket's read still holds all of it
                self.rest = memoryview(b"")

    def release(self) -> None:
        """Drop what is read but not a complete request: the body being read (and its charge to the
        shared budget) and the bytes not yet parsed."""
        self.limits.held -= len(self.body)
        self.body, self.rest = bytearray(), memoryview(b"")

    # --- llhttp's callbacks, from inside feed_data ------------------------------------------------
    def on_message_begin(self) -> None:
        self.incoming, self.url, self.fields, self.headed = Request("", "", {}, b""), b"", [], False
        self.head = len(b"  HTTP/1.1\r\n\r\n")  # the request line's and the head's fixed bytes
        self.conn.began()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.fields) >= MAX_FIELDS:
            self._halt(_text(431, f"over {MAX_FIELDS} header lines\n"))
        if not self.headed:  # trailers are bounded as framing between body bytes (`_feed`)
            self._count(len(name) + len(value) + len(b": \r\n"))
        self.fields.append((name.decode("latin-1").lower(), value.decode("latin-1").strip()))

    def on_headers_complete(self) -> None:
        request, self.headed = self.incoming, True
        version, target = self.parser.get_http_version(), self.url.decode("latin-1")
        request.method = self.parser.get_method().decode("latin-1")
        self._count(len(request.method))
        request.path, _, request.query = target.partition("?")
        request.headers = dict(self.fields)
        names = [n for n, _ in self.fields]
        problem = _problem(version, target, request.headers, names)
        if problem:
            self._halt(_text(400, problem + "\n"))
        length = request.headers.get("content-length", "0")
        if int(length) > MAX_BODY:
            self._halt(_text(413, f"request body over {MAX_BODY >> 20} MiB\n"))
        refusal = self.admit(request) if self.admit is not None else None
        refusal = refusal or self.conn.headed(request)
        if refusal is not None:
            self._halt(refusal)
        request.keep_alive = self.parser.should_keep_alive()
        if self.parser.should_upgrade():  # answered as HTTP/1.1; what follows it is another protocol's
            if length != "0" or "transfer-encoding" in request.headers:
                self._halt(_text(400, "a request asking for a protocol upgrade cannot carry a body here\n"))
            request.keep_alive = False
        if request.headers.get("expect", "").lower() == "100-continue":
            self.conn.send_continue()

    def on_body(self, body: bytes) -> None:
        self.body += body
        self.limits.held += len(body)
        self.advanced = True
        if len(self.body) > MAX_BODY:
            self._halt(_text(413, f"request body over {MAX_BODY >> 20} MiB\n"))
        if self.limits.held > self.limits.body_bytes:
            self.limits.refused += 1
            self._halt(_text(503, "the gateway holds too many request bodies at once; retry shortly\n",
                               [("Retry-After", "1")]))

    def on_message_complete(self) -> None:
        """A complete request, its body's charge now the connection's until its answer is written."""
        request, self.incoming = self.incoming, None
        request.body, self.body = bytes(self.body), bytearray()
        self.advanced = True
        self.conn.received(request)

    def _count(self, size: int) -> None:
        self.head += size
        if self.head > MAX_HEAD:
            self._halt(_text(431, f"request head over {MAX_HEAD >> 10} KiB\n"))

    def _feed(self, piece: memoryview) -> None:
        """Parse a slice; refuse once the parser has read more than `MAX_HEAD` without the body
        growing: a head that long, or chunk framing or trailers, held by httptools and by us."""
        self.advanced = False
        self.parser.feed_data(piece)
        self.stalled = 0 if self.advanced else self.stalled + len(piece)
        if self.stalled <= MAX_HEAD:
            return
        if not self.headed:
            self._halt(_text(431, f"request head over {MAX_HEAD >> 10} KiB\n"))
        self._halt(_text(400, f"over {MAX_HEAD >> 10} KiB of chunk framing or trailers between body bytes\n"))

    def _halt(self, answer: Answer) -> None:
        """Refuse from inside a parser callback (or between slices): parsing stops here."""
        self.conn.refuse(answer)
        raise _Refused


class _Refused(Exception):
    """Raised to stop parsing a connection that has been refused."""


def _problem(version: str, target: str, headers: dict[str, str], names: list[str]) -> str:
    """What is wrong with a request head that llhttp lets through, or ""."""
    if version not in ("1.0", "1.1") or not target.startswith("/"):
        return f"request line: HTTP/{version} {target[:60]!r} (origin-form HTTP/1.x only)"
    twice = next((name for name in SINGLE if names.count(name) > 1), None)
    if twice is not None:
        return f"more than one {twice.title()} header: send it once"
    if version == "1.1" and "host" not in headers:
        return "an HTTP/1.1 request needs a Host header"
    te = headers.get("transfer-encoding")
    if te is not None and te.lower() != "chunked":
        return f"Transfer-Encoding {te[:40]!r}: only chunked is supported"
    return ""


def _text(status: int, text: str, headers: Sequence[tuple[str, str]] = ()) -> Answer:
    return lambda conn: conn.reply(status, text.encode(), "text/plain", headers)
