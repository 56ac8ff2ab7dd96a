"""Shared fixtures: a scratch copy of the shipped stacks, and the CLI runner."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of stacks/ and patches/, with settings pointed at it and a private state dir."""
    for name in ("stacks", "patches", "compose"):
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.setenv("SPARKCTL_STACKS_DIR", str(tmp_path / "stacks"))
    monkeypatch.setenv("SPARKCTL_PATCHES_DIR", str(tmp_path / "patches"))
    monkeypatch.setenv("SPARKCTL_COMPOSE_DIR", str(tmp_path / "compose"))
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKCTL_HF_CACHE_DIR", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("SPARKCTL_HF_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run `sparkctl ARGS...` in-process; returns (exit code, stdout, stderr)."""
    from sparkctl.cli import app as cli_app

    def run(*args: str) -> tuple[int, str, str]:
        cli_app._runtime.__dict__.clear()
        cli_app._runtime.debug = False
        code = cli_app.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run
