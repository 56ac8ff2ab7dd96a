"""The simulated engine's multi-node mode, as processes on loopback: rank 0 serves only once the
other rank joined, and two of the health lies plain `/health` polling falls for (a dead worker:
`/health` 200 and a completion 500; a dead rank 0: the headless worker stays alive). The third,
a link down, needs a link: tests/fleet/test_groups.py takes one down between namespace hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.deploy.health import http_status
from tests.conftest import free_port, wait_for
from tests.teardown import stop


def rank(model: Path, index: int, master_port: int, http_port: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "sparkctl.sim", "serve", str(model), "--served-model-name", "tiny", "--host",
            "127.0.0.1", "--port", str(http_port), "--max-model-len", "2048", "--nnodes", "2", "--node-rank",
            str(index), "--master-addr", "127.0.0.1", "--master-port", str(master_port),
            "--tensor-parallel-size", "2", "--distributed-executor-backend", "mp", *(["--headless"] if index else [])]
    return subprocess.Popen(args, env={**os.environ, "SPARKCTL_SIM_TIME_SCALE": "0.01"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def complete(url: str) -> int:
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    request = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as e:
        return e.code


def logged(proc: subprocess.Popen) -> list[str]:
    """The lines `proc` writes to stderr, as they come (read on a thread of their own)."""
    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return lines


@pytest.fixture
def group(tiny_model_dir: Path) -> Iterator[tuple[subprocess.Popen, subprocess.Popen, str]]:
    master, http = free_port(), free_port()
    url = f"http://127.0.0.1:{http}"
    head = rank(tiny_model_dir, 0, master, http)
    said = logged(head)
    try:
        wait_for(lambda: any("rank 0 waits for 1 rank(s)" in line for line in said) or head.poll() is not None,
                 what="rank 0 loaded and waiting for its worker", logs=lambda: "".join(said))
        assert http_status(url + "/health") is None and head.poll() is None  # alone: not serving
        worker = rank(tiny_model_dir, 1, master, 0)
        try:
            wait_for(lambda: http_status(url + "/health") == 200, what="rank 0 serves once rank 1 joined")
            yield head, worker, url
        finally:
            stop(worker, 0)
    finally:
        stop(head, 0)


def test_a_dead_worker_fails_completions_while_health_says_200(group) -> None:
    head, worker, url = group
    assert complete(url) == 200
    worker.kill()
    worker.wait(timeout=10)
    assert complete(url) == 500
    assert http_status(url + "/health") == 200 and http_status(url + "/v1/models") == 200  # the lie


def test_a_dead_rank_0_leaves_the_headless_worker_alive_and_silent(group) -> None:
    head, worker, url = group
    assert complete(url) == 200
    head.kill()
    head.wait(timeout=10)
    time.sleep(1)  # the behaviour under test: time passes, and the worker that lost rank 0 does not exit
    assert worker.poll() is None  # nothing a `docker ps` would tell apart from a healthy rank
