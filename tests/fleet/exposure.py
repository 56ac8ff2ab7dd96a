"""What another host on the network can reach of a placed engine: requests sent from inside a
namespace host that runs none of the stack (a third machine on the same LAN), with and without the
fleet's relay credential.
"""

from __future__ import annotations

import json
import subprocess
import sys

from sparkctl.fleet.local import TOKEN_FILE, relay_key
from tests.fleet.cluster import Cluster
from tests.fleet.hosts import Host

# vLLM's dev-mode routes: none may ever be reached from off the engine's host.
DEV_ROUTES = ("/sleep?level=1", "/wake_up", "/collective_rpc", "/reset_prefix_cache", "/is_sleeping")
_SEND = """
import json, sys, urllib.error, urllib.request
method, url, headers = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(urllib.request.Request(url, data=b"{}" if method == "POST" else None, method=method,
                                            headers=headers), timeout=10) as reply:
        print(reply.status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError as e:
    print(f"refused: {e}")
"""


def send(host: Host, method: str, url: str, headers: dict[str, str] | None = None) -> str:
    """The status of a request sent from `host`'s network namespace, or `refused: ...`."""
    done = subprocess.run([*host.enter(), sys.executable, "-c", _SEND, method, url, json.dumps(headers or {})],
                          capture_output=True, text=True, timeout=60, check=False)
    return done.stdout.strip() or f"no answer: {done.stderr[-300:]}"


def credential(cluster: Cluster) -> dict[str, str]:
    """The fleet's relay credential, as the head's gateway sends it."""
    return {"Authorization": f"Bearer {relay_key(cluster.root / 'a' / 'fleet' / TOKEN_FILE)}"}


def check_closed(cluster: Cluster, url: str, outsider: Host) -> None:
    """From `outsider`: nothing of the engine at `url` without the credential, no dev route even with
    it, and its API with it (as the head's gateway reaches it)."""
    for path in ("/health", "/metrics", "/v1/models"):
        assert send(outsider, "GET", url + path) == "401", path
    for path in DEV_ROUTES:
        assert send(outsider, "POST", url + path) == "401", path
        assert send(outsider, "POST", url + path, credential(cluster)) == "404", path
    assert send(outsider, "GET", url + "/health", credential(cluster)) == "200"
