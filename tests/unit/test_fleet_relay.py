"""A fleet host's engine relay under a flood from the LAN, on real sockets: idle connections that
never show the credential are bounded in number and time, a flood from one machine closes its own
connections while the head's credentialed request gets through at once, and the relays' loop logs
a repeated error once per interval. The relay runs in a process of its own, at the file limit
where the audit starved it (256), so what is measured is what the kernel gives it."""

from __future__ import annotations

import gc
import os
import socket
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from sparkctl.gateway.relay import LOG_EVERY, LoopErrors, RelayConnection, Relays
from sparkctl.settings import Settings
from tests.fakes import relayprocess

KEY = "relay-test-key"
HEAD, LAN = "127.0.0.1", "127.0.0.2"  # the head, and another machine on the network
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HEAD, 0))
        return probe.getsockname()[1]


def connect(port: int, source: str) -> socket.socket:
    conn = socket.socket()
    conn.bind((source, 0))
    conn.connect((HEAD, port))
    return conn


def ask(conn: socket.socket, *, within: float) -> bytes:
    """The head's probe on `conn`: its answer's status line (b"" when the relay closed it)."""
    conn.settimeout(within)
    conn.sendall(f"GET /health HTTP/1.1\r\nHost: engine\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
    return conn.recv(4096).split(b"\r\n", 1)[0]


def test_idle_connections_from_the_lan_cannot_starve_the_heads_probe(tmp_path: Path) -> None:
    """305 idle connections without the credential (what exhausted the agent's 256 files): the
    head's probe is answered within a second, the relay holds few files, and its log stays small."""
    port, out = free_port(), tmp_path / "relay.log"
    relay = relayprocess.start(port, KEY, log=out, state_dir=tmp_path / "state", within=30)
    flood: list[socket.socket] = []
    try:
        flood = [connect(port, LAN) for _ in range(305)]
        time.sleep(0.5)  # the relay accepts them all
        started = time.monotonic()
        with connect(port, HEAD) as head:
            assert ask(head, within=5) == b"HTTP/1.1 200 OK"
        assert time.monotonic() - started < 1.0
        files = len(os.listdir(f"/proc/{relay.pid}/fd"))
        assert files < 64 + 40, files  # the cap, and the process's own
        time.sleep(2)  # what a starved accept loop would log meanwhile
        assert out.stat().st_size < 4096, out.read_text()[:2000]
    finally:
        for conn in flood:
            conn.close()
        relay.kill()
        relay.wait()


def test_the_oldest_connection_of_the_biggest_peer_makes_room_and_a_silent_one_is_closed() -> None:
    """At the cap, a newcomer is let in and the flooding peer's oldest connection closed; the
    head's open connection stays until it shows the credential, and one that never does is
    closed after the setting's seconds."""
    port = free_port()
    relays = Relays(KEY, unauthenticated=4, credential_within=1.0)
    engine = socket.create_server((HEAD, 0))  # never answers: only the door is looked at here
    try:
        relays.ensure(HEAD, port, f"http://127.0.0.1:{engine.getsockname()[1]}")
        head = connect(port, HEAD)
        flood = [connect(port, LAN) for _ in range(10)]
        time.sleep(0.3)
        closed = [conn for conn in flood if _closed(conn)]
        assert len(closed) == 7 and flood[-3:] == [c for c in flood if c not in closed]  # its oldest went
        assert not _closed(head)
        time.sleep(1.2)
        assert _closed(head) and all(_closed(conn) for conn in flood)  # none showed the credential in time
        assert relays.door.waiting == {} and relays.door.closed == 11
    finally:
        relays.close()
        engine.close()


def test_connections_the_relay_closes_are_freed_at_once() -> None:
    """A flood that reconnects as fast as the relay closes its connections (each 401'd or made room
    for) costs no memory that lasts: none waits for its keep-alive timer (75 s) to be freed."""
    port = free_port()
    relays = Relays(KEY, unauthenticated=4, credential_within=5.0)
    try:
        relays.ensure(HEAD, port, "http://127.0.0.1:9")
        for n in range(300):
            conn = connect(port, LAN)
            if n % 2:
                conn.sendall(b"GET /health HTTP/1.1\r\nHost: engine\r\n\r\n")  # no credential: a 401
                assert conn.recv(4096).startswith(b"HTTP/1.1 401")
            conn.close()
        deadline = time.monotonic() + 5
        while relays.door.waiting:  # the relay has seen the last ones close
            assert time.monotonic() < deadline, len(relays.door.waiting)
            time.sleep(0.05)
        time.sleep(0.2)
        gc.collect()
        assert sum(isinstance(o, RelayConnection) for o in gc.get_objects()) == 0
    finally:
        relays.close()


def test_a_repeated_loop_error_is_logged_once_per_interval_with_its_count() -> None:
    now = [100.0]
    errors = LoopErrors(clock=lambda: now[0])
    context = {"message": "socket.accept() out of system resource", "exception": OSError(24, "Too many open files")}
    with capture_logs() as logs:
        for _ in range(5000):
            errors.report(None, context)
        now[0] += LOG_EVERY
        errors.report(None, context)
    assert [(e["event"], e["count"]) for e in logs] == [("relay_loop_error", 1), ("relay_loop_error", 5000)]
    assert "Too many open files" in logs[0]["error"]


def test_the_settings_bound_the_door_below_the_smallest_file_limit() -> None:
    s = Settings()
    assert s.fleet_relay_unauthenticated <= 64 and s.fleet_relay_credential_within <= 10
    with pytest.raises(ValueError):
        Settings(fleet_relay_unauthenticated=0)


def _closed(conn: socket.socket) -> bool:
    """Whether the relay closed `conn` (it sends nothing to an idle one otherwise)."""
    conn.settimeout(0.05)
    try:
        return conn.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
