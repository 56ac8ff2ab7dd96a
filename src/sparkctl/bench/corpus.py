"""The prompt corpus llama-benchy cuts its prompts from, and which one a run uses. The seeds ran
llama-benchy with its own default book (Sherlock Holmes from Project Gutenberg, `BOOK_URL`), which
llama-benchy downloads once and caches at `~/.cache/llama-benchy/<md5 of the url>.txt`. A run uses
that book when the `bench_corpus` setting says `book`, or says `auto` and the book is cached or its
host answers a TCP connect; otherwise (offline, or `loopback`) it uses sparkctl's own corpus,
generated deterministic prose served on loopback (`--book-url`), and the run records that, since
DFlash's acceptance depends on the text. Used by the benchmark runner.
"""

from __future__ import annotations

import hashlib
import http.server
import random
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

# llama-benchy 0.4.0's default `--book-url` (its config.py); a unit test checks it still is.
BOOK_URL = "https://www.gutenberg.org/files/1661/1661-0.txt"
LOOPBACK_NOTE = ("sparkctl's generated prose served on loopback, not llama-benchy's default book: prompts differ "
                 "from the seeds' method, and DFlash acceptance depends on the text")

Setting = Literal["auto", "book", "loopback"]


@dataclass(frozen=True)
class Choice:
    """The corpus a run uses: `book` (llama-benchy's default, `url`) or `loopback` (ours), and why."""

    kind: Literal["book", "loopback"]
    url: str | None
    note: str

    def record(self) -> dict[str, str | None]:
        return {"kind": self.kind, "url": self.url, "note": self.note}


def choose(setting: Setting, *, home: Path, reachable: Callable[[str], bool]) -> Choice:
    """The corpus for `setting`. `auto` takes the book when llama-benchy's cache under `home` holds
    it (no network needed), else when `reachable(BOOK_URL)`; only then does anything leave the machine."""
    if setting == "loopback":
        return Choice("loopback", None, f"loopback corpus (bench_corpus=loopback): {LOOPBACK_NOTE}")
    if setting == "book":
        return Choice("book", BOOK_URL, "llama-benchy's default book (bench_corpus=book)")
    if (cache := cached_book(home)).is_file():
        return Choice("book", BOOK_URL, f"llama-benchy's default book, from its cache {cache}")
    if reachable(BOOK_URL):
        return Choice("book", BOOK_URL, "llama-benchy's default book, downloaded (the machine is online)")
    host = urlsplit(BOOK_URL).hostname
    return Choice("loopback", None, f"offline ({host} unreachable, no cached copy): {LOOPBACK_NOTE}")


def cached_book(home: Path) -> Path:
    """Where llama-benchy keeps its downloaded default book."""
    return cache_file(BOOK_URL, home)


def cache_file(url: str, home: Path) -> Path:
    """Where llama-benchy caches the text at `url` (its corpus.py: `~/.cache/llama-benchy/<md5>.txt`)."""
    return home / ".cache" / "llama-benchy" / f"{hashlib.md5(url.encode()).hexdigest()}.txt"  # noqa: S324


def reachable(url: str) -> bool:
    """Whether a TCP connect to `url`'s host and port succeeds within 2 seconds."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=2.0):
            return True
    except OSError:
        return False


@contextmanager
def book_args(choice: Choice, *, home: Path) -> Iterator[list[str]]:
    """llama-benchy's `--book-url` arguments while the block runs: none for its own book (it
    fetches or reads its cache itself), our corpus on loopback otherwise. llama-benchy caches
    whatever it downloads under `home`, and our URL's port changes every run: that copy goes."""
    if choice.kind == "book":
        yield []
        return
    with served() as url:
        try:
            yield ["--book-url", url]
        finally:
            cache_file(url, home).unlink(missing_ok=True)

SUBJECTS = ("the engine", "a small model", "the draft head", "the scheduler", "every request", "the operator",
            "the cache", "a long prompt", "the kernel", "the gateway", "the benchmark", "our tokenizer",
            "the memory controller", "a quiet agent", "the weights", "the morning batch")
VERBS = ("reads", "writes", "streams", "waits for", "measures", "compresses", "verifies", "schedules",
         "predicts", "copies", "rejects", "accepts", "warms", "drains", "answers", "remembers")
OBJECTS = ("the next token", "a block of attention", "sixteen thousand words", "the unified memory",
           "a careful reply", "its own mistakes", "the previous context", "a list of tools", "the longest line",
           "every shard of the model", "a table of numbers", "the quiet hours", "a patch to the proposer",
           "the image digest", "the speculative guesses", "an honest figure")
ENDINGS = ("before the fans spin up", "while the agent thinks", "without losing a request", "as the day goes on",
           "and nobody notices", "at the edge of the window", "for the third time", "in a single pass",
           "when the context grows", "so the report stays true")


def text(words: int = 120_000, seed: int = 3) -> str:
    rng = random.Random(seed)
    sentences, count = [], 0
    while count < words:
        sentence = f"{rng.choice(SUBJECTS).capitalize()} {rng.choice(VERBS)} {rng.choice(OBJECTS)} " \
                   f"{rng.choice(ENDINGS)}."
        sentences.append(sentence)
        count += len(sentence.split())
        if rng.random() < 0.15:
            sentences.append("\n\n")
    return " ".join(sentences)


@contextmanager
def served() -> Iterator[str]:
    """The corpus at http://127.0.0.1:PORT/corpus.txt while the block runs."""
    body = text().encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/corpus.txt"
    finally:
        server.shutdown()
        server.server_close()
