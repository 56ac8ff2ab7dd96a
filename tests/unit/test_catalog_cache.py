"""The catalog is read again only when a stack or patch-set file changed: a daemon's passes reuse
it, and an edit (or a new or removed file) applies at the next call. The next process takes it
(and the image policy) from the state dir, unless anyone else could have written that file or
other code made it."""

from __future__ import annotations

import shutil
from pathlib import Path

from sparkctl.settings import Settings
from sparkctl.spec import kept, yamlfile
from sparkctl.spec.imagefile import policy_for
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


def test_the_next_process_takes_the_kept_catalog_without_parsing(tmp_path: Path, monkeypatch) -> None:
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    monkeypatch.setenv("SPARKCTL_STACKS_DIR", str(tmp_path / "stacks"))
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    settings = Settings()
    made, policy = catalog_for(settings), policy_for(settings)
    kept_file = tmp_path / "state" / "cache" / "catalog.pickle"
    assert kept_file.stat().st_mode & 0o777 == 0o600
    kept._held.clear()  # a new process: only the state dir remembers

    def no_parsing(path: Path) -> None:
        raise AssertionError(f"parsed {path}")

    with monkeypatch.context() as m:
        m.setattr(yamlfile, "read", no_parsing)
        again = catalog_for(settings)
        assert again is not made and again.stacks == made.stacks and policy_for(settings) == policy
    path = tmp_path / "stacks" / "qwen36-dflash.yaml"
    path.write_text(path.read_text() + "resources:\n  gpu_memory_utilization: 0.7\n")
    kept._held.clear()
    assert catalog_for(settings).stack("qwen36-dflash").resources.gpu_memory_utilization == 0.70


def test_a_kept_file_others_could_write_or_other_code_made_is_not_read(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_STACKS_DIR", str(ROOT / "stacks"))
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    settings = Settings()
    catalog_for(settings)
    kept_file = tmp_path / "state" / "cache" / "catalog.pickle"
    reads: list[Path] = []
    real = yamlfile.read
    monkeypatch.setattr(yamlfile, "read", lambda path: reads.append(path) or real(path))
    kept_file.chmod(0o666)
    kept._held.clear()
    catalog_for(settings)
    assert reads  # parsed again, and kept again privately
    assert kept_file.stat().st_mode & 0o777 == 0o600
    reads.clear()
    monkeypatch.setattr(kept, "CODE", ("another sparkctl",))
    kept._held.clear()
    catalog_for(settings)
    assert reads
    kept_file.write_bytes(b"torn")
    kept._held.clear()
    assert "qwen36-dflash" in catalog_for(settings).stacks
