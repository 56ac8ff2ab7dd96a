"""The CLI's plain lines and its reporter: user text printed as it is, and progress bars that
parallel downloads can report to at once."""

from __future__ import annotations

import threading

from sparkctl.cli.console import ConsoleReporter, fail, say


def test_lines_are_plain_off_a_terminal_and_markup_in_them_is_text(capsys) -> None:
    say("[red]up[/]", "green", rest=" [bold]x")
    fail("error: [x]")
    out, err = capsys.readouterr()
    assert (out, err) == ("[red]up[/] [bold]x\n", "error: [x]\n")


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
