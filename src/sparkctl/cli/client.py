"""The CLI's client for the daemon's unix-socket API: HTTP/1.1 over a unix socket, a request per
connection, responses framed by llhttp (httptools, as the gateway's are; not `http.client`, whose
email-parser and ssl imports cost a CLI call about 45 ms, docs/perf.md), so a call through the
daemon starts fast; `locate` finds the socket without loading the settings), and the daemon's start and
stop from the CLI: every action runs in the daemon, so a command that finds none starts one."""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httptools

from sparkctl.errors import SparkctlError
from sparkctl.instance import LOCK_FILE

DAEMON_LOG = "daemon.log"  # a daemon the CLI started writes its log here, in its state dir
START_LOCK = "start.lock"  # held by the command that starts a daemon, until it answers
STARTS_WITHIN = 60.0  # s for a started daemon to answer (its imports and recovery, on a loaded machine)
STOPS_WITHIN = 30.0  # s for a daemon to end after SIGTERM (it finishes what it is doing first)
TIMEOUT = 3600.0  # s for a call's answer (an `up` may download and load a model)



class Response:
    """A response's status once its head arrived; its body read as it comes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.status, self.done = sock, 0, False
        self._framed = False  # a length or chunks say where the body ends; else the close does
        self._body: list[bytes] = []
        self._parser = httptools.HttpResponseParser(self)
        while not self.status:
            self._feed()

    def chunks(self) -> Iterator[bytes]:
        while True:
            yield from self._body
            self._body.clear()
            if self.done:
                return
            self._feed()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *_: object) -> None:
        self.sock.close()

    def read(self) -> bytes:
        return b"".join(self.chunks())

    def lines(self) -> Iterator[bytes]:
        pending = b""
        for chunk in self.chunks():
            *whole, pending = (pending + chunk).split(b"\n")
            yield from whole
        if pending:
            yield pending

    def _feed(self) -> None:
        data = self.sock.recv(65536)
        if not data:  # closed: the end of a body sent without a length, else a cut response
            if not self.status or self._framed:
                raise ConnectionError("the connection closed mid-response")
            self.done = True
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            raise ConnectionError(f"a malformed response: {e}") from None

    # httptools' callbacks
    def on_header(self, name: bytes, _value: bytes) -> None:
        self._framed = self._framed or name.lower() in (b"content-length", b"transfer-encoding")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


class UnixHTTP:
    def __init__(self, path: Path, timeout: float) -> None:
        self.path, self.timeout = path, timeout

    def request(self, method: str, target: str, body: dict | None = None) -> Response:
        """Send one request (a JSON body if any); the response holds the connection until its
        `with` block ends. Raises OSError when nothing answers."""
        payload = json.dumps(body).encode() if body is not None else b""
        head = (f"{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                f"Content-Length: {len(payload)}\r\n" + ("Content-Type: application/json\r\n" if payload else "")
                + "\r\n")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(str(self.path))
            sock.sendall(head.encode() + payload)
            return Response(sock)
        except BaseException:
            sock.close()
            raise


class DaemonClient:
    def __init__(self, path: Path) -> None:
        self.path = path

    def available(self) -> bool:
        """Whether a daemon runs on this state dir: it holds the dir's lock file for its lifetime,
        and its socket accepts connections. Neither depends on the daemon's event loop, so a busy
        daemon (or one whose desired.yaml is broken) is never mistaken for none."""
        if self.holder() is None:
            return False  # no daemon (a socket file left behind is stale)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.settimeout(5)
                probe.connect(str(self.path))
        except OSError:
            return False  # starting: it holds the lock but does not listen yet
        return True

    def holder(self) -> int | None:
        """The pid of the daemon holding the state dir's lock, None when no process holds it."""
        try:
            with open(self.path.with_name(LOCK_FILE)) as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    return int(lock.read().strip() or 0)  # the daemon writes its pid there
                fcntl.flock(lock, fcntl.LOCK_UN)
                return None
        except FileNotFoundError:
            return None

    def ensure(self) -> int | None:
        """Start a daemon when none runs, detached (its own session, outliving this command), with
        this process's environment and working directory as its settings and its log in DAEMON_LOG;
        wait until it says it serves (systemd's readiness protocol: `READY=1` to NOTIFY_SOCKET, an
        abstract socket of this command's). Returns the started daemon's pid, None when one
        already answers. Commands that start one at once take turns (START_LOCK): the later ones
        find the first one's daemon answering."""
        if self.available():
            return None
        state = self.path.parent
        state.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(state / START_LOCK, "a") as turn:
            fcntl.flock(turn, fcntl.LOCK_EX)  # bounded: the holder waits STARTS_WITHIN at most
            return None if self.available() else self._start(state)

    def _start(self, state: Path) -> int:
        log_path = state / DAEMON_LOG
        name = f"sparkctl-ready-{os.getpid()}-{id(self)}"  # abstract: no file to clean up, no path length limit
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ready:
            ready.bind("\0" + name)
            with os.fdopen(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as log:
                child = subprocess.Popen([sys.executable, "-m", "sparkctl", "daemon"], stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=os.environ | {"NOTIFY_SOCKET": "@" + name})
            exited = os.pidfd_open(child.pid)
            try:
                answered, _, _ = select.select([ready, exited], [], [], STARTS_WITHIN)
            finally:
                os.close(exited)
            if ready in answered and ready.recv(4096).startswith(b"READY=1"):
                return child.pid
        if answered:
            holder = self.holder()
            if holder is not None:  # a daemon started beside the CLI's (systemd's) took the lock first
                raise SparkctlError(f"a daemon (pid {holder}) holds {state} but does not answer yet; retry in a "
                                    f"moment, or see its log")
            raise SparkctlError(f"the daemon did not start (exit code {child.wait()}): {_last_line(log_path)}; "
                                f"its log: {log_path}")
        raise SparkctlError(f"the daemon (pid {child.pid}) did not answer within {STARTS_WITHIN:g} s of its start; "
                            f"its log: {log_path}")

    def stop(self) -> int | None:
        """SIGTERM to the daemon on this state dir, and wait until it has ended; its engines keep
        running, for the next daemon to adopt. Returns its pid, None when none ran."""
        pid = self.holder()
        if not pid:
            return None
        try:
            ended = os.pidfd_open(pid)  # a handle on this very process: a reused pid is not signalled
        except ProcessLookupError:
            return pid
        try:
            signal.pidfd_send_signal(ended, signal.SIGTERM)
            if not select.select([ended], [], [], STOPS_WITHIN)[0]:
                raise SparkctlError(f"the daemon (pid {pid}) did not end within {STOPS_WITHIN:g} s of SIGTERM; "
                                    f"its log: {self.path.with_name(DAEMON_LOG)}")
        except ProcessLookupError:
            pass  # it ended between the lock's read and the signal
        finally:
            os.close(ended)
        return pid

    def get(self, path: str) -> Any:
        with UnixHTTP(self.path, TIMEOUT).request("GET", path, None) as response:
            if response.status != 200:
                raise SparkctlError(_message(response))
            return json.loads(response.read())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        with UnixHTTP(self.path, TIMEOUT).request("POST", path, body) as response:
            if response.status != 200:
                raise SparkctlError(_message(response))
            return json.loads(response.read())

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """POST `body`; the NDJSON events of the response as they come. The request is sent and
        the response's head read before this returns, so what the caller does next overlaps the
        daemon's work."""
        response = UnixHTTP(self.path, TIMEOUT).request("POST", path, body)
        if response.status != 200:
            with response:
                raise SparkctlError(_message(response))
        return _events(response)

def _events(response: Response) -> Iterator[dict[str, Any]]:
    with response:
        for line in response.lines():
            if line.strip():
                yield json.loads(line)


def _last_line(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1][:500] if lines else "an empty log"


def _message(response: Response) -> str:
    raw = response.read()
    try:
        return json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return f"daemon answered HTTP {response.status}: {raw[:200]!r}"
