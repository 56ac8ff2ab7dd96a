"""Ray is the `fleet` extra, not a base dependency: without it every `sparkctl fleet` command ends
in one line saying how to add Ray to this very install, before it touches anything (the daemon
heading a fleet refuses the same way: tests/integration/test_packaging.py, in a venv without Ray).
Ray is hidden here as Python hides a module it is told is absent (`sys.modules["ray"] = None`)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sparkctl.adapters import ray
from sparkctl.errors import SparkctlError
from tests.conftest import ROOT

WITHOUT_RAY = "import sys; sys.modules['ray'] = None; from sparkctl.cli.app import command; command()"


@pytest.mark.parametrize("args", [["init"], ["join", "10.0.0.1:6379"], ["status"], ["leave"], ["ps"],
                                  ["up", "qwen36-dflash"], ["down", "qwen36-dflash"], ["check-image", "a:b"]])
def test_every_fleet_command_without_ray_says_what_to_install(args: list[str], tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKCTL_")}
    done = subprocess.run([sys.executable, "-c", WITHOUT_RAY, "fleet", *args], capture_output=True, text=True,
                          env=env | {"HOME": str(tmp_path), "SPARKCTL_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: the fleet runs on Ray, which this install of sparkctl leaves out (the `fleet` extra); add it with: "
        f"{sys.executable} -m pip install 'ray==2.60.0'"], done.stderr
    assert not (tmp_path / "state").exists()  # refused before anything: no token written, no node recorded


@pytest.mark.parametrize(("receipt", "advice"), [
    (None, f"{sys.executable} -m pip install 'ray==2.60.0'"),
    ("pipx_metadata.json", "pipx inject sparkctl 'ray==2.60.0'"),  # pipx names its venv after the package
])
def test_the_advice_fits_how_sparkctl_was_installed(receipt: str | None, advice: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = tmp_path / "sparkctl"
    prefix.mkdir()
    if receipt:
        (prefix / receipt).write_text("{}")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SparkctlError) as refused:
        ray.RayBackend(token_file=tmp_path / "token", timeout=10, namespace="t")
    assert str(refused.value).endswith(f"add it with: {advice}")


def test_with_ray_installed_the_backend_is_built() -> None:
    ray.require_ray()  # the test venv has the `fleet` extra (through `test`)


def test_the_advice_names_the_fleet_extras_pin() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["fleet"] == [ray.RAY]
    [itself] = [r for r in extras["test"] if r.startswith("sparkctl[")]  # `make venv` installs `.[test]`
    assert "fleet" in itself.removeprefix("sparkctl[").rstrip("]").split(","), itself  # the fleet's tests have Ray
