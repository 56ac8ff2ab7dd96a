"""The layering of STYLE.md, enforced: who may import what."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "sparkctl"
EDGE_LIBRARIES = {"docker", "python_on_whales", "huggingface_hub"}
# package -> sparkctl packages it must not import (lower layers never reach up)
FORBIDDEN = {
    "policy": {"cli", "daemon", "deploy", "gateway", "bench", "report", "adapters", "state", "spec"},
    "spec": {"cli", "daemon", "deploy", "gateway", "bench", "report", "adapters", "state"},
    "state": {"cli", "daemon", "deploy", "gateway", "bench", "report", "adapters"},
    "adapters": {"cli", "daemon", "deploy", "gateway", "bench", "report"},
    "bench": {"cli", "daemon", "gateway", "report"},
    "report": {"cli", "daemon", "gateway", "deploy", "adapters"},
}
# The simulated engine runs inside its image with nothing else of sparkctl.
SELF_CONTAINED = {"sim"}


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


# sim/image/ is the content of an image (a vLLM-shaped package), not sparkctl code.
MODULES = sorted(p for p in SRC.rglob("*.py") if "image" not in p.relative_to(SRC).parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_layers(path: Path) -> None:
    package = path.relative_to(SRC).parts[0]
    imports = _imports(path)
    if package != "adapters":
        edge = {name for name in imports if name.split(".")[0] in EDGE_LIBRARIES}
        assert not edge, f"only sparkctl.adapters may import {sorted(edge)}"
    inner = {name.split(".")[1] for name in imports if name.startswith("sparkctl.") and name.count(".")}
    assert not inner & FORBIDDEN.get(package, set()), f"{package} imports {sorted(inner & FORBIDDEN[package])}"
    if package in SELF_CONTAINED:
        assert inner <= {package}, f"{package} must stay self-contained, imports {sorted(inner - {package})}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_every_module_has_a_docstring(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path} needs a module docstring"
