"""The Hugging Face Hub, through `huggingface_hub`: resolve a revision, download a snapshot.

The token comes from settings and never reaches a log line or an error message; Hub errors
become SparkctlErrors that say what to do (gated repo -> set SPARKCTL_HF_TOKEN). Built once by
the CLI or the daemon.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from sparkctl.adapters.retry import transient
from sparkctl.errors import SparkctlError, TransientError, Unreachable, unreachable_problem

Progress = Callable[[int, int], None]  # (bytes done, bytes total)

# Files downloaded at once. huggingface_hub's default (8) queues the rest of a repo behind its
# first eight files; 16 keeps every shard of a ~30B bf16 checkpoint (a dozen 5 GB shards) in
# flight, each its own HTTP stream over a network. No slower on loopback (8, 16, 32 measure alike).
WORKERS = 16
HUB = "https://huggingface.co"  # huggingface_hub's endpoint when SPARKCTL_HF_ENDPOINT is unset
# snapshot_download's second byte bar: bytes received from the network, whose total it grows as
# it goes (with hf_xet those differ from the bytes written); only the bytes-written bar is reported.
_TRANSFER_BAR = "huggingface_hub.snapshot_download.transfer"


@dataclass(frozen=True)
class Snapshot:
    repo: str
    commit: str
    files: dict[str, int]  # path -> size in bytes

    @property
    def size(self) -> int:
        return sum(self.files.values())


def repo_folder(cache_dir: Path, repo: str) -> Path:
    """Where the Hugging Face cache keeps a model repo (snapshots/, blobs/, refs/)."""
    return cache_dir / ("models--" + repo.replace("/", "--"))


def cached_snapshot(cache_dir: Path, repo: str, revision: str) -> Path:
    """The snapshot dir of `repo` at `revision` (a commit, or a branch the cache has a ref for)."""
    folder = repo_folder(cache_dir, repo)
    commit = revision
    if not re.fullmatch(r"[0-9a-f]{40}", revision):
        try:
            commit = (folder / "refs" / revision).read_text().strip()
        except OSError:
            raise SparkctlError(f"{repo}@{revision} is not in the Hugging Face cache ({cache_dir}); "
                                "`sparkctl up` downloads it") from None
    return folder / "snapshots" / commit


class HubClient:
    """huggingface_hub is imported on first use: an unchanged `up` never needs it."""

    def __init__(self, *, cache_dir: Path, token: str | None = None, endpoint: str | None = None) -> None:
        self.cache_dir, self._token, self.endpoint = cache_dir, token, endpoint

    @transient()
    def resolve(self, repo: str, revision: str) -> Snapshot:
        """The commit `revision` names now, with every file's size."""
        from huggingface_hub import HfApi

        _no_telemetry()
        with _translated(repo, revision, self.endpoint):
            info = HfApi(endpoint=self.endpoint, token=self._token or False).model_info(
                repo, revision=revision, files_metadata=True)
        return Snapshot(repo, info.sha, {s.rfilename: s.size or 0 for s in info.siblings or []})

    def missing_bytes(self, snapshot: Snapshot) -> int:
        """Bytes still to download (files already complete in the cache don't count)."""
        folder = repo_folder(self.cache_dir, snapshot.repo) / "snapshots" / snapshot.commit
        return sum(size for path, size in snapshot.files.items()
                   if not ((folder / path).is_file() and (folder / path).stat().st_size == size))

    @transient()
    def download(self, snapshot: Snapshot, *, revision: str, progress: Progress | None = None) -> Path:
        """Download the snapshot (resuming partial files); `revision` names it in the cache refs."""
        from huggingface_hub import snapshot_download

        _no_telemetry()
        with _translated(snapshot.repo, snapshot.commit, self.endpoint):
            path = snapshot_download(snapshot.repo, revision=snapshot.commit, cache_dir=self.cache_dir,
                                     endpoint=self.endpoint, token=self._token or False, max_workers=WORKERS,
                                     tqdm_class=_bar_class(progress) if progress else None)
        if revision != snapshot.commit:  # let offline readers find it by the name the stack used
            refs = repo_folder(self.cache_dir, snapshot.repo) / "refs"
            refs.mkdir(parents=True, exist_ok=True)
            (refs / revision).write_text(snapshot.commit)
        return Path(path)


def load() -> None:
    """Import huggingface_hub's client now (~0.3 s of one core), so that a first fetch does not wait
    for it: the daemon calls it in the background once it serves."""
    from huggingface_hub import HfApi, snapshot_download  # noqa: F401


def _no_telemetry() -> None:
    """huggingface_hub adds an AI-agent field to its user agent from a registry it fetches from
    its default endpoint (huggingface.co), whatever endpoint a call names; its telemetry switch
    turns that off. sparkctl asks the Hub it is pointed at, and nothing else."""
    from huggingface_hub import constants

    constants.HF_HUB_DISABLE_TELEMETRY = True


def _bar_class(progress: Progress) -> type:
    from huggingface_hub.utils import tqdm as hf_tqdm

    class Bar(hf_tqdm):
        """A silent tqdm that forwards the bytes written by the download to `progress`. Enabled, so
        that it counts, but it never draws: no line formatted, no monitor thread."""

        monitor_interval = 0

        def __init__(self, *args, **kwargs) -> None:
            self.reported = kwargs.pop("name", None) != _TRANSFER_BAR
            super().__init__(*args, **{**kwargs, "file": io.StringIO(), "disable": False})

        def update(self, n: float | None = 1) -> bool | None:
            shown = super().update(n)
            if self.reported and self.unit == "B" and self.total:
                progress(int(self.n), int(self.total))
            return shown

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            return True

    return Bar


@contextmanager
def _translated(repo: str, revision: str, endpoint: str | None) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into errors a Spark owner can act on."""
    try:
        yield
    except Exception as error:
        if _unreachable(error):  # httpx's: neither an OSError nor one of huggingface_hub's
            raise Unreachable(f"read {repo}@{revision} at the Hub", host=urlsplit(endpoint or HUB).netloc,
                              problem=unreachable_problem(error), setting="SPARKCTL_HF_ENDPOINT") from None
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        where = f"{repo}@{revision}"
        if isinstance(error, GatedRepoError):
            raise SparkctlError(f"{where} is a gated repo and the Hub refused access "
                                f"({_status(error)}): accept its terms on the Hub and set SPARKCTL_HF_TOKEN "
                                "(or HF_TOKEN) to a token that may read it") from None
        if isinstance(error, RevisionNotFoundError):
            raise SparkctlError(f"{where}: no such revision on the Hub; fix `revision` in the stack") from None
        if isinstance(error, RepositoryNotFoundError):
            raise SparkctlError(f"{repo}: no such repo on the Hub (or it is private: set "
                                "SPARKCTL_HF_TOKEN); fix `repo` in the stack") from None
        if isinstance(error, LocalEntryNotFoundError | HfHubHTTPError | OSError):
            raise TransientError(f"download of {where} failed: {type(error).__name__}: "
                                 f"{str(error).splitlines()[0] if str(error) else ''}; rerun to resume",
                                 delay=2.0) from None
        raise


def _unreachable(error: Exception) -> bool:
    """A connection failure of huggingface_hub's HTTP client (httpx under 1.x, httpx2 under 2.x)."""
    return any(c.__name__ == "TransportError" and c.__module__.startswith("httpx") for c in type(error).__mro__)


def _status(error: Exception) -> str:
    response = getattr(error, "response", None)
    return f"HTTP {response.status_code}" if response is not None else "no access"
