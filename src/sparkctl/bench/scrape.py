"""`python -m sparkctl.bench.scrape METRICS_URL FILE`: append one /metrics reading to FILE as a
JSON line (`null` if the engine did not answer). llama-benchy runs it after every test run
(`--post-run-cmd`), so counters are read exactly between runs. Standard library only: it
starts in milliseconds."""

from __future__ import annotations

import json
import sys

from sparkctl.adapters import engine


def main(argv: list[str]) -> int:
    url, path = argv
    try:
        text = engine.text(url, timeout=10)
    except OSError:
        text = None
    with open(path, "a") as out:
        out.write(json.dumps(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
