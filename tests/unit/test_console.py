"""The CLI's plain lines and its reporter: colour where rich would put it, and progress bars that
parallel downloads can report to at once."""

from __future__ import annotations

import io
import threading

import pytest

from sparkctl.cli.console import ConsoleReporter, paint


@pytest.mark.parametrize(("env", "terminal", "coloured"), [
    ({}, True, True),
    ({}, False, False),  # a pipe or a file
    ({"NO_COLOR": "1"}, True, False),
    ({"TERM": "dumb"}, True, False),
    ({"FORCE_COLOR": "1"}, False, True),
])
def test_lines_are_coloured_where_rich_would_colour_them(monkeypatch, env, terminal, coloured) -> None:
    for key in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    stream = io.StringIO()
    stream.isatty = lambda: terminal
    assert paint("up", "green", stream) == ("\x1b[32mup\x1b[0m" if coloured else "up")


def test_threads_reporting_at_once_share_one_set_of_bars() -> None:
    start = threading.Barrier(8, timeout=10)

    def download(shard: int) -> None:
        start.wait()
        for done in range(0, 101, 10):
            reporter.progress("s", f"shard {shard}", done, 100)

    with ConsoleReporter() as reporter:
        threads = [threading.Thread(target=download, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert sorted(reporter.tasks) == [f"shard {i}" for i in range(8)]
        assert len(reporter.bars.tasks) == 8 and all(task.completed == 100 for task in reporter.bars.tasks)
