"""The CLI's plain lines and its reporter: user text printed as it is, and a Ctrl-C of an action
that says only what the daemon's cancel answered."""

from __future__ import annotations

import pytest

from sparkctl import messages
from sparkctl.cli.console import fail, say, through_daemon


def test_lines_are_plain_off_a_terminal_and_markup_in_them_is_text(capsys) -> None:
    say("[red]up[/]", "green", rest=" [bold]x")
    fail("error: [x]")
    out, err = capsys.readouterr()
    assert (out, err) == ("[red]up[/] [bold]x\n", "error: [x]\n")


class Interrupted:
    """A daemon client whose action stream gets a Ctrl-C, and whose cancel answers `answer`."""

    def __init__(self, answer: dict) -> None:
        self.answer, self.asked, self.cancels = answer, None, []

    def stream(self, path: str, body: dict):
        self.asked = body
        raise KeyboardInterrupt

    def post(self, path: str, body: dict) -> dict:
        self.cancels.append((path, body))
        return self.answer


@pytest.mark.parametrize(("cancelled", "said"), [
    (True, "pull a: cancelled: it left the queue before its turn: it did not run"),
    (False, "pull a: not cancelled: it ran; `sparkctl status` shows it"),
])
def test_a_ctrl_c_cancels_the_commands_own_action_and_says_what_the_daemon_answered(capsys, cancelled, said) -> None:
    why = "it left the queue before its turn: it did not run" if cancelled else "it ran"
    daemon = Interrupted({"done": "cancel", "action": "x", "cancelled": cancelled, "why": why})
    with pytest.raises(KeyboardInterrupt):
        through_daemon(daemon, "/v1/pull", messages.PullRequest("a"), messages.PullDone)
    assert len(daemon.asked["action"]) == 16  # named for the daemon, afresh
    assert daemon.cancels == [("/v1/cancel", {"action": daemon.asked["action"]})]  # that action, not the stack
    assert capsys.readouterr().err.splitlines() == ["pull a: cancelling in the daemon", said]
