"""Paths in stacks and patch sets stay inside their roots: overlay sources inside the snapshot,
targets and shim files inside the overlay dir, diffs inside patches/, revisions inside the HF
cache. Refused when the files are loaded, and again when the deploy resolves them on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sparkctl.deploy.patches import PatchError, _apply, _steps, _write, within
from sparkctl.spec.engine import Weights
from sparkctl.spec.patchset import Overlay, PatchSet, Shim


@pytest.mark.parametrize(("model", "data"), [
    (Overlay, {"source": "model:../../etc/passwd", "target": "x.py"}),
    (Overlay, {"source": "draft:/etc/passwd", "target": "x.py"}),
    (Overlay, {"source": "draft:a.py", "target": "../../../x.py"}),
    (Overlay, {"source": "draft:a.py", "target": "/abs/x.py"}),
    (Shim, {"file": "../../x.py", "class": "A", "attributes": {"a": "1"}}),
    (PatchSet, {"name": "p", "diffs": ["../../../etc/shadow"]}),
    (PatchSet, {"name": "p", "diffs": ["/etc/shadow"]}),
    (Weights, {"repo": "a/b", "revision": "../../x"}),
    (Weights, {"repo": "a/b", "revision": "/x"}),
    (Weights, {"repo": "a/b", "revision": "main/../../x"}),
])
def test_escaping_paths_are_refused_when_loaded(model, data: dict) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(data)


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "c0ffee" * 6 + "abcd"])
def test_real_revisions_pass(revision: str) -> None:
    assert Weights(repo="a/b", revision=revision).revision == revision


def test_a_symlink_out_of_the_snapshot_is_refused(tmp_path: Path) -> None:
    snapshot = tmp_path / "models--a--b" / "snapshots" / "c0ffee"
    snapshot.mkdir(parents=True)
    (tmp_path / "models--a--b" / "blobs").mkdir()
    (tmp_path / "models--a--b" / "blobs" / "ok").write_text("x = 1\n")
    (snapshot / "good.py").symlink_to(tmp_path / "models--a--b" / "blobs" / "ok")  # as the HF cache keeps files
    (snapshot / "evil.py").symlink_to("/etc/passwd")
    good = Overlay(source="draft:good.py", target="a.py")
    assert _apply(good, None, rel="a.py", sources={"draft": snapshot}, vllm_dir="/v") == "x = 1\n"
    with pytest.raises(PatchError, match="leads outside"):
        _apply(Overlay(source="draft:evil.py", target="a.py"), None, rel="a.py", sources={"draft": snapshot},
               vllm_dir="/v")


def test_a_diff_naming_a_path_outside_is_refused(tmp_path: Path) -> None:
    (tmp_path / "evil.diff").write_text("--- a/../../x.py\n+++ b/../../x.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(PatchError, match="relative path inside"):
        _steps([PatchSet(name="p", diffs=("evil.diff",))], tmp_path)


def test_writing_overlays_stays_in_their_folder(tmp_path: Path) -> None:
    with pytest.raises(PatchError, match="leads outside"):
        _write(tmp_path / "overlays" / "abc", {"../../escaped.py": "x"})
    assert not (tmp_path / "escaped.py").exists()
    assert within(tmp_path, "a/b.py") == tmp_path / "a" / "b.py"
