"""The build hook (hatchling's `custom` hook, pyproject.toml): bakes the commit sparkctl is built
from into the wheel as `sparkctl/_commit.txt`, so `sparkctl version` names it with no git at run
time. From a checkout it asks git (`sparkctl.origin.from_git`); a wheel built from an sdist takes
the file the sdist carries; with neither it says "unknown"."""

from __future__ import annotations

import runpy
import shutil
import tempfile
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("src") / "sparkctl"


class CommitHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if version == "editable":  # runs from the checkout, which asks git
            return
        root = Path(self.root)
        origin = runpy.run_path(str(root / SOURCE / "origin.py"))  # stdlib only: sparkctl's imports are not here
        shipped = root / SOURCE / origin["COMMIT_FILE"]
        commit = origin["from_git"](root) or (shipped.read_text().strip() if shipped.exists() else origin["UNKNOWN"])
        self.scratch = Path(tempfile.mkdtemp(prefix="sparkctl-build-"))
        baked = self.scratch / origin["COMMIT_FILE"]
        baked.write_text(commit + "\n")
        inside = SOURCE if self.target_name == "sdist" else Path("sparkctl")
        build_data["force_include"][str(baked)] = str(inside / origin["COMMIT_FILE"])

    def finalize(self, version: str, build_data: dict, artifact_path: str) -> None:
        if hasattr(self, "scratch"):
            shutil.rmtree(self.scratch, ignore_errors=True)
