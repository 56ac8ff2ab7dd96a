"""Real components for integration tests: the Docker engine, a registry on loopback, labels.

Under CI (`CI` set) a missing engine is a failure; elsewhere the tier skips with one line.
Everything a test creates carries `sparkctl.test-run=<id>` and is removed afterwards.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

BASE_IMAGE = "sparkctl-test/base:bookworm"
TEST_LABEL = "sparkctl.test-run"


def _missing(what: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{what} (CI must provide it: run `make test`)")
    pytest.skip(f"{what}; `make test` sets it up")


@pytest.fixture(scope="session")
def engine():
    from sparkctl.adapters.docker import DockerEngine
    from sparkctl.errors import DockerError

    try:
        engine = DockerEngine()
        engine.client.ping()
    except (DockerError, Exception) as e:  # noqa: BLE001 - any failure means no usable engine
        _missing(f"no Docker engine: {e}")
    return engine


@pytest.fixture(scope="session")
def base_image(engine) -> str:
    if not engine.client.images.list(name=BASE_IMAGE):
        _missing(f"image {BASE_IMAGE} is missing (scripts/base-image.sh builds it)")
    return BASE_IMAGE


@pytest.fixture
def run_id(engine) -> Iterator[str]:
    """A per-test id; containers labelled with it are removed when the test ends."""
    rid = uuid.uuid4().hex[:10]
    yield rid
    for c in engine.client.api.containers(all=True, filters={"label": f"{TEST_LABEL}={rid}"}):
        engine.remove(c["Id"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    """Debian's docker-registry on 127.0.0.1:<free port>, with its own data dir."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
        )
        self.proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"docker-registry exited: {self.proc.stderr.read().decode()}")
                time.sleep(0.1)
        raise RuntimeError("docker-registry did not answer within 20 s")

    def push(self, image: str, repo_tag: str) -> str:
        """Push a local image as `<registry>/repo_tag`; returns the manifest digest."""
        target = f"{self.host}/{repo_tag}"
        subprocess.run(["docker", "tag", image, target], check=True)
        out = subprocess.run(["docker", "push", target], check=True, capture_output=True, text=True).stdout
        subprocess.run(["docker", "rmi", target], check=True, capture_output=True)
        return re.search(r"digest: (sha256:[0-9a-f]{64})", out).group(1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def registry(engine, tmp_path_factory) -> Iterator[Registry]:
    if shutil.which("docker-registry") is None:
        _missing("docker-registry is not installed")
    reg = Registry(tmp_path_factory.mktemp("registry"))
    yield reg
    reg.stop()


@pytest.fixture
def tiny_image(engine) -> Iterator:
    """Make one-file images locally (nothing can be pulled): distinct content, distinct digest."""
    made: list[str] = []

    def make(content: str) -> str:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("stamp")
            info.size = len(content.encode())
            tar.addfile(info, io.BytesIO(content.encode()))
        repo, tag = "sparkctl-test/tiny", uuid.uuid4().hex[:8]
        engine.client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag)
        made.append(f"{repo}:{tag}")
        return made[-1]

    yield make
    for name in made:
        engine.client.images.remove(name, force=True)
