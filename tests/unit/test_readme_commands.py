"""Every `sparkctl …` line the README shows in a code block names a command that exists, with
options that command takes: the guide cannot drift from the CLI. Each is checked against the
command's own `--help`, in-process (nothing runs)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from sparkctl.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```[a-z]*\n(.*?)```", re.S)


def shown() -> list[str]:
    """Each `sparkctl …` invocation in the README's code blocks (a line may chain several with &&)."""
    lines = [line.strip().removeprefix("$ ") for block in BLOCK.findall((ROOT / "README.md").read_text())
             for line in block.splitlines()]
    found = []
    for line in lines:
        for part in line.split("#")[0].split("&&"):
            if part.strip().startswith("sparkctl "):
                found.append(part.strip())
    return found


def path_and_options(command: str) -> tuple[list[str], list[str]]:
    """The subcommand path (the words that name commands) and the `--options` the line passes."""
    words = shlex.split(command)[1:]
    path: list[str] = []
    command_ = typer.main.get_command(app)
    for word in words:  # through click's own lookup: the root loads its groups when asked
        group = hasattr(command_, "get_command")  # typer's own copy of click: asked by shape, not by class
        found = command_.get_command(command_.context_class(command_), word) if group else None
        if found is None:
            break
        path.append(word)
        command_ = found
    return path, [w.split("=")[0] for w in words if w.startswith("-") and w != "-"]


def test_the_readme_shows_commands() -> None:
    assert len(shown()) >= 10


@pytest.mark.parametrize("command", shown())
def test_a_command_the_readme_shows_exists_and_takes_its_options(command: str) -> None:
    path, options = path_and_options(command)
    assert path, f"{command!r}: no such command"
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, f"{command!r}: `sparkctl {' '.join(path)} --help` failed: {result.output}"
    for option in options:
        assert re.search(rf"(^|[\s,]){re.escape(option)}([\s,=]|$)", result.output, re.M), \
            f"{command!r}: `sparkctl {' '.join(path)}` takes no {option}"
