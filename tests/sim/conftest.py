"""Run the simulated engine as a process on loopback (the image runs the same code)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.deploy.health import http_status
from tests.conftest import free_port, wait_for
from tests.fakes.tinymodel import write_model
from tests.teardown import stop


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny"), weights=False)


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
        # its stderr, read as it comes (a full pipe would stall the sim), for `logs` and `wait_logged`
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)

    def logs(self) -> str:
        """Its stderr so far; all of it once the process has exited."""
        if self.proc.poll() is not None:
            self._reader.join(5)
        return "".join(self.lines)

    def wait_logged(self, text: str, timeout: float = 30) -> None:
        """Until a line of its stderr holds `text`; fails if it exits first."""
        wait_for(lambda: text in self.logs() or self.proc.poll() is not None, timeout, f"the sim to log {text!r}",
                 self.logs)
        assert text in self.logs(), f"sim exited {self.proc.returncode} before logging {text!r}: {self.logs()}"

    def status(self, path: str = "/health") -> int | None:
        return http_status(self.url + path)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.status() != 200:
            if self.proc.poll() is not None:
                raise AssertionError(f"sim exited {self.proc.returncode}: {self.logs()}")
            assert time.monotonic() < deadline, "sim did not become healthy"
            time.sleep(0.02)

    def stop(self) -> None:
        """Killed at once: an engine dying mid-stream is what some tests are about."""
        stop(self.proc, 0)


@pytest.fixture
def sim(tiny_model) -> Iterator:
    started: list[SimProcess] = []

    def start(*args: str, **kw) -> SimProcess:
        started.append(SimProcess(tiny_model, *args, **kw))
        return started[-1]

    yield start
    for p in started:
        p.stop()
