"""tests/teardown.py's `stop`: SIGTERM, a bounded wait, SIGKILL; never an exception for a process
slow to exit."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.teardown import stop

EXITS_ON_TERM = "import time; print('up', flush=True); time.sleep(60)"
IGNORES_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); "
                "time.sleep(60)")


def started(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"  # its signal disposition is set
    return proc


@pytest.mark.parametrize(("code", "grace", "ended_by"), [
    (EXITS_ON_TERM, 10, -signal.SIGTERM),  # exits on SIGTERM: no kill
    (IGNORES_TERM, 0.2, -signal.SIGKILL),  # outlives its grace: killed, not an error
    (EXITS_ON_TERM, 0, -signal.SIGKILL),  # grace 0: an abrupt death at once
])
def test_stop_ends_and_reaps_the_process(code: str, grace: float, ended_by: int, capfd) -> None:
    proc = started(code)
    assert stop(proc, grace) == ended_by
    assert proc.returncode == ended_by  # reaped
    said = capfd.readouterr().err
    assert ("after SIGTERM; killed" in said) == (grace > 0 and ended_by == -signal.SIGKILL), said


def test_stop_of_an_exited_process_returns_its_code() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait(30)
    assert stop(proc) == 3
