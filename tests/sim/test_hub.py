"""The local Hub, exercised by the real huggingface_hub client: snapshots, pinned revisions,
gated repos, missing files and a dropped connection that resumes."""

from __future__ import annotations

import http.client
import random
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from huggingface_hub import hf_hub_download, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RevisionNotFoundError

from tests.fakes.hub import Hub, HubServer
from tests.fakes.repos import DIFFUSIONGEMMA, DSPARK_DRAFT, QWEN_NVFP4, seed_repos
from tests.fakes.tinymodel import write_model

TOKEN = "hf_localhubtoken0123456789"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("hubmodel"))


@pytest.fixture
def hub(model_dir: Path):
    with HubServer(Hub(seed_repos(model_dir), token=TOKEN)) as server:
        yield server


def test_snapshot_records_the_commit(hub, tmp_path: Path) -> None:
    path = Path(snapshot_download(DSPARK_DRAFT, revision="main", cache_dir=tmp_path, endpoint=hub.endpoint))
    repo = hub.hub.repos[DSPARK_DRAFT]
    assert path.name == repo.commit
    assert (path / "vllm_patches" / "qwen3_dflash.py").read_bytes() == repo.files["vllm_patches/qwen3_dflash.py"]
    assert {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} == set(repo.files)


def test_pinned_revision_and_unknown_revision(hub, tmp_path: Path) -> None:
    commit = hub.hub.repos[QWEN_NVFP4].commit
    path = Path(snapshot_download(QWEN_NVFP4, revision=commit, cache_dir=tmp_path, endpoint=hub.endpoint))
    assert path.name == commit
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(QWEN_NVFP4, revision="0" * 40, cache_dir=tmp_path / "b", endpoint=hub.endpoint)


def test_gated_repo_needs_the_token(hub, tmp_path: Path) -> None:
    with pytest.raises(GatedRepoError) as no_token:
        hf_hub_download(DIFFUSIONGEMMA, "config.json", cache_dir=tmp_path, endpoint=hub.endpoint, token=False)
    assert no_token.value.response.status_code == 401
    with pytest.raises(GatedRepoError) as wrong:
        hf_hub_download(DIFFUSIONGEMMA, "config.json", cache_dir=tmp_path, endpoint=hub.endpoint, token="hf_wrong")
    assert wrong.value.response.status_code == 403
    path = snapshot_download(DIFFUSIONGEMMA, cache_dir=tmp_path, endpoint=hub.endpoint, token=TOKEN)
    assert (Path(path) / "tokenizer.json").is_file()


def test_missing_file_is_entry_not_found(hub, tmp_path: Path) -> None:
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(QWEN_NVFP4, "nope.bin", cache_dir=tmp_path, endpoint=hub.endpoint)


def test_dropped_connection_resumes_with_a_range_request(hub, tmp_path: Path) -> None:
    # The client writes in 10 MB chunks: cut a 24 MB file after 15 MB so one chunk is on disk.
    weights = random.Random(7).randbytes(24 * 2**20)
    hub.hub.repos[QWEN_NVFP4].files["model-00002-of-00002.safetensors"] = weights
    hub.hub.drop_after["model-00002-of-00002.safetensors"] = 15 * 2**20
    path = Path(snapshot_download(QWEN_NVFP4, cache_dir=tmp_path, endpoint=hub.endpoint))
    assert (path / "model-00002-of-00002.safetensors").read_bytes() == weights
    assert any(r.endswith(f"00002.safetensors bytes={10 * 2**20}-") for r in hub.hub.requests), hub.hub.requests


def test_a_reply_does_not_wait_for_the_clients_delayed_ack(hub, model_dir: Path) -> None:
    """Headers and body go out in two writes; with Nagle on, each JSON reply on a kept-alive
    connection waited ~40 ms for the client's delayed ACK, in every client's time alike. Judged
    against a control in the same run, the same hub with Nagle back on: the ACK's wait is a fixed
    40 ms per reply however busy the machine, so the difference shows it, not the machine's speed."""
    with HubServer(Hub(seed_repos(model_dir), token=TOKEN)) as control:
        control.server.RequestHandlerClass.disable_nagle_algorithm = False  # this server's own handler class
        ours, nagle = twenty_replies(hub.endpoint), twenty_replies(control.endpoint)
    assert nagle - ours > 20 * 0.020, f"20 replies took {ours:.3f} s, {nagle:.3f} s with Nagle on"  # half a wait each


def twenty_replies(endpoint: str) -> float:
    """Seconds for 20 JSON replies, one after another on one kept-alive connection."""
    address = urlsplit(endpoint)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=5)
    start = time.perf_counter()
    for _ in range(20):
        connection.request("GET", f"/api/models/{DSPARK_DRAFT}")
        assert connection.getresponse().read()
    connection.close()
    return time.perf_counter() - start
