"""The fleet's control plane for real: a Ray head and one worker on two loopback addresses, each
started by `sparkctl fleet` from its own state dir (two "Sparks" on one machine).

Slow (about 15 s): it covers what the unit tests cannot, that Ray 2.60 starts with every address
explicit and token auth on, that `fleet status` reads its node table, that a STRICT_SPREAD group
over the per-Spark resources lands one bundle per host, that a killed node is seen dead, and that
`leave` stops every process by pid. Ray's death detection is shortened through
SPARKCTL_FLEET_DEAD_AFTER (its health-check system config).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkctl.adapters import processes
from sparkctl.adapters.ray import RayBackend
from sparkctl.fleet import local
from sparkctl.node import NodeState

HEAD, WORKER = "127.0.0.2", "127.0.0.3"
PORT_A, PORT_B = 27100, 27400  # on one machine the blocks must not overlap (Ray listens on every interface)


@pytest.fixture
def fleet_dirs() -> Iterator[Path]:
    # Short: Ray's unix sockets live under the state dir's fleet/ray (pytest's tmp_path is too long).
    root = Path(tempfile.mkdtemp(prefix="sf", dir="/tmp"))
    (root / "fleet.yaml").write_text(f"""
head: a
hosts:
  - {{name: a, serving: {{interface: lo, address: {HEAD}}}, memory: 2GiB, ray: {{address: {HEAD}, port: {PORT_A}}}}}
  - {{name: b, serving: {{interface: lo, address: {WORKER}}}, memory: 3GiB, ray: {{address: {WORKER}, port: {PORT_B}}}}}
""")
    yield root
    for state in ("a", "b"):  # whatever a failed test left: stop it by its recorded pids
        record = local.read_record(root / state / "fleet" / local.RECORD_FILE)
        if record is not None:
            processes.stop(processes.Session.from_dict(record.handle), grace=0, sig=9)
    subprocess.run(["rm", "-rf", str(root)], check=False)


def sparkctl(root: Path, state: str, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **(env or {}), "SPARKCTL_STATE_DIR": str(root / state),
           "SPARKCTL_FLEET_FILE": str(root / "fleet.yaml"), "SPARKCTL_FLEET_NUM_CPUS": "1",
           "SPARKCTL_FLEET_OBJECT_STORE_MIB": "100", "SPARKCTL_FLEET_DEAD_AFTER": "2",
           "SPARKCTL_FLEET_RAY_TIMEOUT": "40", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "sparkctl", "fleet", *args], capture_output=True, text=True, env=env,
                          timeout=90)


def hosts(root: Path) -> dict[str, dict]:
    done = sparkctl(root, "a", "status", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return {row["host"]: row for row in json.loads(done.stdout)["hosts"]}


def test_head_and_worker_on_loopback(fleet_dirs: Path) -> None:
    root = fleet_dirs
    started = sparkctl(root, "a", "init", "--host", "a")
    assert started.returncode == 0, started.stdout + started.stderr
    token = root / "a" / "fleet" / local.TOKEN_FILE
    assert token.stat().st_mode & 0o777 == 0o600
    joined = sparkctl(root, "b", "join", f"{HEAD}:{PORT_A}", "--host", "b", "--token-file", str(token))
    assert joined.returncode == 0, joined.stdout + joined.stderr
    secret = token.read_text().strip()
    records = {s: local.read_record(root / s / "fleet" / local.RECORD_FILE) for s in "ab"}
    for record in records.values():  # the token is on no command line of any node process
        for proc in processes.alive(processes.Session.from_dict(record.handle)):
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
            assert secret not in cmdline

    seen = hosts(root)
    assert {h: seen[h]["state"] for h in "ab"} == {"a": "alive", "b": "alive"}
    assert (seen["a"]["ray_address"], seen["b"]["ray_address"]) == (HEAD, WORKER)
    assert seen["a"]["resources"]["spark:a"] == 1 and seen["b"]["resources"]["spark:b"] == 1
    assert (seen["a"]["memory_gib"], seen["b"]["memory_gib"]) == (2, 3)

    backend = RayBackend(token_file=token, timeout=40, namespace="sparkctl-test")
    placed = backend.place(f"{HEAD}:{PORT_A}", local_address=HEAD, name="spread",
                           bundles=[{"spark:a": 1}, {"spark:b": 1}], strategy="STRICT_SPREAD")
    assert placed.nodes == (seen["a"]["node_id"], seen["b"]["node_id"])
    assert backend.remove(f"{HEAD}:{PORT_A}", local_address=HEAD, name="spread")

    killed = backend.stop_node(records["b"], kill=True)  # a crash: SIGKILL, no goodbye to the head
    assert killed and not backend.running(records["b"])
    deadline = time.monotonic() + 30
    while (state := hosts(root)["b"]["state"]) != NodeState.DEAD and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state == NodeState.DEAD and hosts(root)["a"]["state"] == NodeState.ALIVE

    left = sparkctl(root, "a", "leave")
    assert left.returncode == 0, left.stdout + left.stderr
    assert not backend.running(records["a"])
    assert not (root / "a" / "fleet" / local.RECORD_FILE).exists()


SLOW_AGENT = """import sys, time
if any(arg.endswith("dashboard/agent.py") for arg in sys.argv):
    time.sleep(20)  # Ray 2.60's raylet waits 15 s for this agent's port file unless it is told the port
"""


def test_a_dashboard_agent_slower_than_the_raylets_wait_does_not_fail_the_start(fleet_dirs: Path) -> None:
    """As on a loaded machine, where the agent's imports take longer than the raylet's fixed wait:
    `ray start` through `adapters/raystart.py` tells the raylet the port, so the node starts."""
    site = fleet_dirs / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_AGENT)  # run by every Python process Ray starts
    done = sparkctl(fleet_dirs, "a", "init", "--host", "a", env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stdout + done.stderr
    time.sleep(22)  # the agent has written its port by now; the raylet must still run
    record = local.read_record(fleet_dirs / "a" / "fleet" / local.RECORD_FILE)
    assert record is not None
    running = [Path(f"/proc/{p.pid}/comm").read_text().strip()
               for p in processes.alive(processes.Session.from_dict(record.handle))]
    assert "raylet" in running and "gcs_server" in running, running
