"""A host's engine relays as a process of their own, at the 256-file limit that an agent hit in
the audit (issue 45, item 5), in front of a tiny engine: what the relay's flood test and its
benchmark attack. `start` returns the process once it serves; closing its stdin ends it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = r"""
import http.server, resource, sys, threading
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from sparkctl.gateway.relay import Relays
from sparkctl.settings import Settings

class Engine(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass

engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Engine)
threading.Thread(target=engine.serve_forever, daemon=True).start()
s = Settings()
relays = Relays(sys.argv[2], unauthenticated=s.fleet_relay_unauthenticated,
                credential_within=s.fleet_relay_credential_within)
relays.ensure("127.0.0.1", int(sys.argv[1]), f"http://127.0.0.1:{engine.server_address[1]}")
print("ready", flush=True)
sys.stdin.read()
"""


def start(port: int, key: str, *, log: Path, state_dir: Path, within: float = 60) -> subprocess.Popen:
    """The relays on `port` (loopback, every 127/8 address), their output in `log`, once ready."""
    with log.open("wb") as out:
        relay = subprocess.Popen([sys.executable, "-c", SCRIPT, str(port), key], stdin=subprocess.PIPE, stdout=out,
                                 stderr=subprocess.STDOUT, env={**os.environ, "SPARKCTL_STATE_DIR": str(state_dir)})
    deadline = time.monotonic() + within
    while b"ready" not in log.read_bytes():
        if relay.poll() is not None or time.monotonic() > deadline:
            relay.kill()
            raise RuntimeError(f"the relay did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)
    return relay
