"""The weights step: model and draft at their pinned revisions, from the Hub or a local dir.

Resolves the revision to a commit once and records it (later `up`s use that commit without
asking the Hub, unless `--refresh`), refuses to start a download the disk cannot hold (with
the numbers), and downloads with byte progress, resuming partial files. Called by the
pipeline; the token stays inside the Hub adapter.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from sparkctl.adapters.hub import HubClient, repo_folder
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import SparkctlError
from sparkctl.spec.engine import Weights
from sparkctl.state.store import Store

HEADROOM = 1 << 30  # leave a GiB free: the page cache and logs need room too


@dataclass(frozen=True)
class FetchedWeights:
    path: Path  # the files, on the host
    commit: str  # the Hub commit, or "local:<path>"
    mount: Path  # what to mount: the repo's cache folder (snapshot symlinks point into its blobs/)
    subpath: str = ""  # `path` relative to `mount`


def fetch(weights: Weights, *, hub: HubClient, store: Store, refresh: bool, reporter: Reporter,
          stack: str, label: str) -> FetchedWeights:
    if weights.path is not None:
        path = Path(weights.path)
        if not path.is_dir():
            raise SparkctlError(f"{label} path {path} is not a directory on this machine")
        return FetchedWeights(path, f"local:{path}", path)
    assert weights.repo is not None
    key = f"hf:{weights.repo}@{weights.revision}"
    folder = repo_folder(hub.cache_dir, weights.repo)
    known = None if refresh else store.digests.get(key)
    if known and (folder / "snapshots" / known).is_dir():
        return FetchedWeights(folder / "snapshots" / known, known, folder, f"snapshots/{known}")
    snapshot = hub.resolve(weights.repo, weights.revision)
    missing = hub.missing_bytes(snapshot)
    if missing:
        free = shutil.disk_usage(existing(hub.cache_dir)).free
        if missing + HEADROOM > free:
            raise SparkctlError(
                f"not enough disk for {weights.repo}: {_gib(missing)} to download (+{_gib(HEADROOM)} headroom), "
                f"{_gib(free)} free at {hub.cache_dir}; free space or point SPARKCTL_HF_CACHE_DIR elsewhere")
    path = hub.download(snapshot, revision=weights.revision,
                        progress=lambda done, total: reporter.progress(stack, f"{label} {weights.repo}", done, total))
    store.digests.record(key, snapshot.commit)
    return FetchedWeights(path, snapshot.commit, folder, path.relative_to(folder).as_posix())


def existing(path: Path) -> Path:
    """`path`, or its nearest ancestor that exists (where a folder yet to be made would go)."""
    while not path.exists():
        path = path.parent
    return path


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"
