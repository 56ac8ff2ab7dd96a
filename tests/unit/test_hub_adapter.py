"""The weights step against the local Hub, beside plain `snapshot_download`: it asks the Hub no
more than the client alone does, downloads every shard of a repo at once, and reports the bytes
written (not the network bar hf_xet grows as it goes)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download
from tqdm import tqdm

from sparkctl.adapters.hub import _TRANSFER_BAR, HubClient, _bar_class
from sparkctl.deploy import weights
from sparkctl.deploy.progress import RecordingReporter
from sparkctl.spec.engine import Weights
from sparkctl.state.store import Store
from tests.fakes.hub import Hub, HubServer, Repo

SHARDS = 12  # more than huggingface_hub's default max_workers (8)


class Together(Hub):
    """Serves no file until `count` file GETs wait at once. If they never do, the barrier breaks
    after 5 s, before the client's 10 s read timeout, and the files are served anyway."""

    def __init__(self, repos: dict[str, Repo], count: int) -> None:
        super().__init__(repos)
        self.together = threading.Barrier(count, timeout=5)

    def take_drop(self, path: str) -> int | None:
        with contextlib.suppress(threading.BrokenBarrierError):
            self.together.wait()
        return super().take_drop(path)


def shards(count: int) -> dict[str, bytes]:
    return {f"model-{i:05d}-of-{count:05d}.safetensors": bytes([i]) * 65536 for i in range(1, count + 1)}


def fetch(hub: HubClient, tmp_path: Path, reporter: RecordingReporter) -> weights.FetchedWeights:
    return weights.fetch(Weights(repo="perf/weights"), hub=hub, store=Store(tmp_path / "state.db"), refresh=False,
                         reporter=reporter, stack="s", label="model")


def test_the_weights_step_asks_the_hub_no_more_than_snapshot_download(tmp_path: Path) -> None:
    repo = Repo(shards(3) | {"config.json": b"{}", "tokenizer.json": b'{"model": {}}'})
    with HubServer(Hub({"perf/weights": repo})) as server:
        snapshot_download("perf/weights", cache_dir=tmp_path / "plain", endpoint=server.endpoint, token=False)
        plain = sorted(server.hub.requests)
        server.hub.requests.clear()
        reporter = RecordingReporter()
        fetched = fetch(HubClient(cache_dir=tmp_path / "ours", endpoint=server.endpoint), tmp_path, reporter)
    assert len(server.hub.requests) <= len(plain), (server.hub.requests, plain)
    assert fetched.commit == repo.commit and (fetched.path / "config.json").read_bytes() == b"{}"
    size = sum(map(len, repo.files.values()))
    assert reporter.progressed == {"model perf/weights": (size, size)}


def test_nothing_is_asked_of_any_hub_but_the_one_configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants
    from huggingface_hub.utils import _headers

    asked = []  # huggingface_hub's agent detection fetches its registry from huggingface.co
    monkeypatch.setattr(_headers, "detect_agent", lambda: asked.append(1))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    with HubServer(Hub({"perf/weights": Repo(shards(2))})) as server:
        fetch(HubClient(cache_dir=tmp_path / "hub", endpoint=server.endpoint), tmp_path, RecordingReporter())
    assert asked == [] and server.hub.requests


def test_every_shard_downloads_at_once(tmp_path: Path) -> None:
    with HubServer(Together({"perf/weights": Repo(shards(SHARDS))}, SHARDS)) as server:
        fetched = fetch(HubClient(cache_dir=tmp_path / "hub", endpoint=server.endpoint), tmp_path,
                        RecordingReporter())
    assert not server.hub.together.broken  # all twelve GETs were in flight together
    assert len(list(fetched.path.iterdir())) == SHARDS


def test_progress_follows_the_bytes_written_bar_only() -> None:
    seen: list[tuple[int, int]] = []
    bar = _bar_class(lambda done, total: seen.append((done, total)))
    written = bar(total=100, unit="B", name="huggingface_hub.snapshot_download")
    received = bar(total=100, unit="B", name=_TRANSFER_BAR)
    received.total = 125  # hf_xet's network bar grows its total as bytes arrive
    received.update(90)
    written.update(40)
    assert seen == [(40, 100)]


def test_the_progress_bar_counts_but_never_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[dict] = []
    monkeypatch.setattr(tqdm, "format_meter", staticmethod(lambda **kwargs: drawn.append(kwargs) or ""))
    seen: list[tuple[int, int]] = []
    bar = _bar_class(lambda done, total: seen.append((done, total)))(
        total=300, unit="B", name="huggingface_hub.snapshot_download", mininterval=0)
    for _ in range(3):
        bar.update(100)
    bar.set_description("Reconstruction complete")
    bar.close()
    assert seen == [(100, 300), (200, 300), (300, 300)]
    assert drawn == [] and bar.fp.getvalue().strip() == ""
    assert bar.monitor_interval == 0  # no monitor thread either
