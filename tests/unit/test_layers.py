"""The layering of docs/design.md, enforced by import-linter contracts; and every module says what it is."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "sparkctl"
ROOT = SRC.parents[1]
# sim/image/ is the content of an image (a vLLM-shaped package), not sparkctl code.
MODULES = sorted(p for p in SRC.rglob("*.py") if "image" not in p.relative_to(SRC).parts)


def test_the_import_contracts_hold() -> None:
    """The layers, the edge libraries and the self-contained sim, as import-linter contracts in
    pyproject.toml (the same check `lint-imports` runs)."""
    linter = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(linter), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_every_module_has_a_docstring(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path} needs a module docstring"
