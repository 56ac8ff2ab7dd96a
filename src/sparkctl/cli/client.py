"""The CLI's client for the daemon's unix-socket API (stdlib and httptools, so a call through the daemon
starts fast; `locate` finds the socket without loading the settings)."""

from __future__ import annotations

import fcntl
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparkctl.errors import SparkctlError
from sparkctl.locate import LOCK_FILE
from sparkctl.unixhttp import Response, UnixHTTP


class DaemonClient:
    def __init__(self, path: Path, *, timeout: float = 3600) -> None:
        self.path, self.timeout = path, timeout

    def available(self) -> bool:
        """Whether a daemon runs on this state dir: it holds the dir's lock file for its lifetime,
        and its socket accepts connections. Neither depends on the daemon's event loop, so a busy
        daemon (or one whose desired.yaml is broken) is never mistaken for none."""
        try:
            with open(self.path.with_name(LOCK_FILE)) as lock:
                fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(lock, fcntl.LOCK_UN)
                return False  # nobody holds it: no daemon (a socket file left behind is stale)
        except BlockingIOError:
            pass
        except FileNotFoundError:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(5)
                probe.connect(str(self.path))
        except OSError:
            return False  # starting: it holds the lock but does not listen yet
        return True

    def get(self, path: str, *, timeout: float | None = None) -> Any:
        return self._call("GET", path, None, timeout)

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST `body`; the NDJSON events of the response as they come. The request is sent and
        the response's head read before this returns, so what the caller does next overlaps the
        daemon's work."""
        response = UnixHTTP(self.path, self.timeout).request("POST", path, body)
        if response.status != 200:
            with response:
                raise SparkctlError(_message(response))
        return _events(response)

    def _call(self, method: str, path: str, body: dict | None, timeout: float | None) -> Any:
        with UnixHTTP(self.path, timeout or self.timeout).request(method, path, body) as response:
            if response.status != 200:
                raise SparkctlError(_message(response))
            return json.loads(response.read())


def _events(response: Response) -> Iterator[dict[str, Any]]:
    with response:
        for line in response.lines():
            if line.strip():
                yield json.loads(line)


def _message(response: Response) -> str:
    raw = response.read()
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"daemon answered HTTP {response.status}: {raw[:200]!r}"
