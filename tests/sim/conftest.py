"""Run the simulated engine as a process on loopback (the image runs the same code)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.sim.tinymodel import write_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny"), weights=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimProcess:
    def __init__(self, model: Path, *args: str, scale: float = 0.01, load_scale: float | None = None,
                 env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "sparkctl.sim", "serve", str(model), "--served-model-name", "tiny",
               "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "70000", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "SPARKCTL_SIM_TIME_SCALE": str(scale),
                                          "SPARKCTL_SIM_LOAD_SCALE": str(scale if load_scale is None else load_scale),
                                          **(env or {})})

    def status(self, path: str = "/health") -> int | None:
        """HTTP status, or None while the port refuses connections."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.status() != 200:
            if self.proc.poll() is not None:
                raise AssertionError(f"sim exited {self.proc.returncode}: {self.proc.stderr.read()}")
            assert time.monotonic() < deadline, "sim did not become healthy"
            time.sleep(0.02)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def sim(tiny_model) -> Iterator:
    started: list[SimProcess] = []

    def start(*args: str, **kw) -> SimProcess:
        started.append(SimProcess(tiny_model, *args, **kw))
        return started[-1]

    yield start
    for p in started:
        p.stop()
