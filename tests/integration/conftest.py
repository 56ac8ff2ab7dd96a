"""The integration tier's daemon harness: a real `sparkctl daemon` process on the test's state
dir, with a private gateway port and short backoffs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from sparkctl.cli.client import DaemonClient
from tests.conftest import wait_for  # noqa: F401  (re-exported for the integration tests)
from tests.fakes.repos import QWEN_NVFP4
from tests.fakes.throttle import Link
from tests.integration.agents import FAST_LOAD, A, B, amend, routed
from tests.teardown import stop

MB = 10**6
SMALL = "resources:\n  gpu_memory_utilization: 0.4\n"  # two of these fit under the 0.9 ceiling


# What systemd does for a socket unit: the listening socket as fd 3, LISTEN_PID and LISTEN_FDS set.
HAND_OVER = ("import os, sys; os.dup2(int(sys.argv[1]), 3); os.environ.update(LISTEN_PID=str(os.getpid()), "
             "LISTEN_FDS='1'); os.execv(sys.executable, [sys.executable, '-m', 'sparkctl', 'daemon'])")


STARTS_WITHIN = 60.0  # s: about 1 s on a quiet machine; a loaded 2-core CI machine has taken over 20


class DaemonProcess:
    def __init__(self, state_dir: Path, env: dict[str, str] | None = None, *,
                 handed: socket.socket | None = None) -> None:
        self.state_dir = state_dir
        self.log = open(state_dir.parent / "daemon.log", "a")  # noqa: SIM115 - closed in stop()
        command = [sys.executable, "-m", "sparkctl", "daemon"]
        if handed is not None:
            command = [sys.executable, "-c", HAND_OVER, str(handed.fileno())]
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env or dict(os.environ),
                                     pass_fds=(handed.fileno(),) if handed else ())
        self.client = DaemonClient(state_dir / "sparkctl.sock")
        deadline = time.monotonic() + STARTS_WITHIN
        while not self.client.available() or self.client.holder() != self.proc.pid:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                stop(self.proc, 0)  # a daemon that did not come up is not left behind
                self.log.close()
                raise AssertionError(f"the daemon did not answer within {STARTS_WITHIN:g} s (exit "
                                     f"{self.proc.returncode}; the state dir's daemon: pid {self.client.holder()}, "
                                     f"one a command started?):\n{self.logs()[-3000:]}")
            time.sleep(0.05)

    def logs(self) -> str:
        return (self.state_dir.parent / "daemon.log").read_text()

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, as systemd sends it, and up to 20 s to exit: one that exits fails the test unless
        with 0. Slower (under load) it is killed and the test warned, not failed; the daemon dumps
        its threads' stacks into the log after 10 s, for a stop that hangs."""
        if self.proc.poll() is None:
            code = stop(self.proc, 20)
            if code in (None, -signal.SIGKILL):
                warnings.warn(f"the daemon did not stop within 20 s of SIGTERM: killed\n{self.logs()[-12000:]}",
                              stacklevel=2)
            else:
                assert code == 0, self.logs()[-3000:]
        self.log.close()


@pytest.fixture
def start_daemon(world, monkeypatch):
    monkeypatch.setenv("SPARKCTL_RESTART_BACKOFF_BASE", "0.2")
    monkeypatch.setenv("SPARKCTL_RESYNC_INTERVAL", "2")
    started: list[DaemonProcess] = []

    def start(handed: socket.socket | None = None) -> DaemonProcess:
        started.append(DaemonProcess(world / "state", handed=handed))
        return started[-1]

    yield start
    for d in started:
        d.stop()


def containers(engine, stack: str | None = None) -> list[dict]:
    from tests.conftest import ours

    return ours(engine, stack)


@pytest.fixture
def slow_hub(world, hub, monkeypatch):
    """The Hub behind a 2 MB/s link, the model 40 MB larger: its download takes ~20 s."""
    hub.hub.repos[QWEN_NVFP4].files["model-slow.safetensors"] = bytes(40 * MB)
    link = Link(2 * MB, hub.endpoint.removeprefix("http://"))
    monkeypatch.setenv("SPARKCTL_HF_ENDPOINT", f"http://{link.host}")
    yield link
    link.stop()
    del hub.hub.repos[QWEN_NVFP4].files["model-slow.safetensors"]


@pytest.fixture
def switching(world, start_daemon, monkeypatch):
    """A daemon serving `primary` = qwen36-dflash; `small` makes both stacks fit side by side; the
    old stack leaves by `park` (stop: removed, as these tests expect)."""
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", FAST_LOAD)

    def start(*, small: bool, extra: dict[str, str] | None = None, park: str = "stop", key: str | None = None):
        for stack in (A, B):
            amend(world / "stacks" / f"{stack}.yaml", switch={"bench": "off", "park": park},
                  **({"resources": {"gpu_memory_utilization": 0.4}} if small else {}))
        for name, text in (extra or {}).items():
            (world / "stacks" / f"{name}.yaml").write_text(text)
        (world / "state").mkdir(exist_ok=True)
        (world / "state" / "desired.yaml").write_text(f"stacks: [{A}]\naliases: {{primary: {A}}}\n")
        daemon = start_daemon()
        daemon.gateway = f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"
        wait_for(lambda: routed(daemon.gateway, key) == A, timeout=60, what="primary routed", logs=daemon.logs)
        return daemon

    return start
