"""Shell completion is on: `--show-completion` prints the script for a shell, and the script's
call completes commands and subcommands (the lazily imported groups included)."""

from __future__ import annotations

import os
import subprocess
import sys


def sparkctl(*args: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-m", "sparkctl", *args], env=os.environ | env, capture_output=True,
                          text=True, check=True, timeout=60).stdout


def test_show_completion_prints_the_shells_script() -> None:
    assert "complete -o default -F _sparkctl_completion sparkctl" in sparkctl("--show-completion", "bash")


def test_the_script_completes_commands_and_a_groups_subcommands() -> None:
    assert sparkctl(_SPARKCTL_COMPLETE="complete_bash", COMP_WORDS="sparkctl sta", COMP_CWORD="1").split() == [
        "stacks", "status"]
    assert sparkctl(_SPARKCTL_COMPLETE="complete_bash", COMP_WORDS="sparkctl stacks l", COMP_CWORD="2").split() == [
        "list"]
