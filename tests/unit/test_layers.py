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
    """The layers, the daemon's and the gateway's own layers, the fleet apart from the gateway,
    the edge libraries and the self-contained sim, as import-linter contracts in pyproject.toml
    (the same check `lint-imports` runs)."""
    linter = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(linter), "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0 and "0 broken" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_every_module_has_a_docstring(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path} needs a module docstring"


def test_engines_are_called_through_their_adapter_only() -> None:
    """HTTP to engines goes through `adapters/engine.py` (never a proxy, always a timeout), and to
    registries through `adapters/registry.py`: no other module of sparkctl imports urllib.request
    (the sim, which runs in its own image, aside).
    import-linter cannot say this: it sees only the top-level package of the standard library's."""
    found = []
    for path in MODULES:
        if path.relative_to(SRC).parts[0] == "sim" or path in (SRC / "adapters" / "engine.py",
                                                               SRC / "adapters" / "registry.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and node.module \
                else []
            found += [f"{path.relative_to(SRC)}: {name}" for name in names if name.startswith("urllib.request")
                      or name == "urllib.request"]
    assert not found, found
