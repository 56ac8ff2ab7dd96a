"""The catalog is read again only when a stack or patch-set file changed: a daemon's passes reuse
it, and an edit (or a new or removed file) applies at the next call."""

from __future__ import annotations

import shutil
from pathlib import Path

from sparkctl.settings import Settings
from sparkctl.spec.load import catalog_for

ROOT = Path(__file__).resolve().parents[2]


def test_the_catalog_is_reused_until_a_file_changes(tmp_path: Path, monkeypatch) -> None:
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    monkeypatch.setenv("SPARKCTL_STACKS_DIR", str(tmp_path / "stacks"))
    monkeypatch.setenv("SPARKCTL_PATCHES_DIR", str(tmp_path / "patches"))
    settings = Settings()
    first = catalog_for(settings)
    assert catalog_for(settings) is first
    path = tmp_path / "stacks" / "qwen36-dflash.yaml"
    path.write_text(path.read_text() + "resources:\n  gpu_memory_utilization: 0.7\n")
    edited = catalog_for(settings)
    assert edited is not first and edited.stack("qwen36-dflash").resources.gpu_memory_utilization == 0.70
    (tmp_path / "stacks" / "extra.yaml").write_text("name: extra\nextends: qwen36-dflash\n")
    assert "extra" in catalog_for(settings).stacks
    (tmp_path / "stacks" / "extra.yaml").unlink()
    assert "extra" not in catalog_for(settings).stacks
