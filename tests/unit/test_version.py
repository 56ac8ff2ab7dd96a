"""`sparkctl version` names the version and the commit: a checkout asks git, a wheel carries the
commit from its build (hatch_build.py) and needs no git to say it, and without either it is
"unknown"."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from sparkctl import __version__, origin

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "from sparkctl.origin import commit; print(commit())"


def test_version_in_a_checkout_names_its_commit() -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    done = subprocess.run([sys.executable, "-m", "sparkctl", "version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith(f"sparkctl {__version__} (commit {head}")
    assert done.stdout.strip() == f"sparkctl {__version__} (commit {origin.from_git(ROOT)})"


def test_a_built_wheel_carries_the_commit_and_says_it_without_git(tmp_path: Path) -> None:
    """Builds the wheel with pip (hatchling from the configured index, in pip's isolated build
    environment under tmp_path), then reads the commit from the unpacked wheel with no git on PATH."""
    env = os.environ | {"TMPDIR": str(tmp_path), "PIP_NO_CACHE_DIR": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)], env=env,
                   capture_output=True, check=True, timeout=240)
    [wheel] = tmp_path.glob(f"sparkctl-{__version__}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path / "installed")
    assert (tmp_path / "installed" / "sparkctl" / origin.COMMIT_FILE).read_text().strip() == origin.from_git(ROOT)
    bare = {"PATH": str(tmp_path / "no-git"), "PYTHONPATH": str(tmp_path / "installed")}
    said = subprocess.run([sys.executable, "-c", COMMIT], env=bare, capture_output=True, text=True, check=True)
    assert said.stdout.strip() == origin.from_git(ROOT)


def test_without_a_baked_commit_or_a_checkout_the_commit_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "sparkctl").mkdir()
    shutil.copy(Path(origin.__file__), tmp_path / "sparkctl" / "origin.py")
    (tmp_path / "sparkctl" / "__init__.py").touch()
    said = subprocess.run([sys.executable, "-c", COMMIT], env={"PYTHONPATH": str(tmp_path)}, capture_output=True,
                          text=True, check=True)
    assert said.stdout.strip() == origin.UNKNOWN
