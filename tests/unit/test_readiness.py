"""The daemon says it serves by systemd's readiness protocol, to systemd or to the CLI that
started it: `READY=1` to the datagram socket NOTIFY_SOCKET names, a path or an abstract name."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sparkctl.daemon.process import notify_ready


@pytest.mark.parametrize("abstract", [True, False])
def test_ready_reaches_the_starters_socket_once_and_is_not_inherited(abstract: bool, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"sparkctl-test-ready-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as starter:
        starter.bind("\0" + name if abstract else str(tmp_path / "ready.sock"))
        starter.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name if abstract else str(tmp_path / "ready.sock"))
        notify_ready()
        assert starter.recv(64) == b"READY=1"
        assert "NOTIFY_SOCKET" not in os.environ  # an engine or child started later does not inherit it
        notify_ready()  # nothing to tell now: no second datagram, no error
        starter.setblocking(False)
        with pytest.raises(BlockingIOError):
            starter.recv(64)


def test_a_starter_that_is_gone_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", f"@sparkctl-test-nobody-{os.getpid()}")
    notify_ready()
