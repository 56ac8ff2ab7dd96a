"""The prompt corpus llama-benchy cuts its prompts from, served on loopback (`--book-url`): no
benchmark fetches anything from the internet. The text is generated, deterministic prose about
running models on a small machine; llama-benchy only needs enough ordinary tokens."""

from __future__ import annotations

import http.server
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

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
