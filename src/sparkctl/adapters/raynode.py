"""This Spark's Ray node: its `ray start` command line (every address and port explicit), its
environment (token auth from a file, no usage reporting), a fresh temp dir and free ports checked
first; started as a new session leader with a deadline, so that the processes it leaves are
recorded (`adapters.processes`) and later stopped by pid. Called by `RayBackend` (`ray.py`)."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from sparkctl.adapters import processes
from sparkctl.errors import SparkctlError
from sparkctl.node import LABEL_HOST, NodeLaunch, NodeRecord, host_resource

SOCKET_PATH_MAX = 107  # AF_UNIX; Ray puts `session_<stamp>_<pid>/sockets/plasma_store` under its temp dir
SESSION_SUFFIX = 62
# A node's ports, from its first one (spec.fleet.PORT_BLOCK of them): +0 is the head's GCS.
OFFSETS = {"--node-manager-port": 1, "--object-manager-port": 2, "--dashboard-agent-listen-port": 3,
           "--dashboard-agent-grpc-port": 4, "--metrics-export-port": 5, "--runtime-env-agent-port": 6}
WORKER_PORTS = (16, 255)
DASHBOARD_OFFSET = 7  # the head's minimal dashboard process binds one even with the dashboard off
REGISTRATION_MISSED = "timed out during startup"  # Ray's message when its raylet did not register in time
REGISTRATION_WAIT = 30.0  # s: Ray's fixed wait for that (ray/_private/node.py)
START_ATTEMPTS = 2
# `ray start` through raystart.py, which tells the raylet its agent's port (Ray 2.60 does not)
LAUNCHER = (sys.executable, "-m", "sparkctl.adapters.raystart")
START_GRACE = 10.0  # s after a node joins before the head's health checks may declare it dead


def start_command(launch: NodeLaunch, *, ray: Sequence[str] = LAUNCHER) -> list[str]:
    """The `ray start` command line for `launch` (through `ray`, the launcher): every address and
    port explicit, no token."""
    labels = ",".join(f"{k}={v}" for k, v in {LABEL_HOST: launch.host, **launch.labels}.items())
    command = [*ray, "start", f"--node-ip-address={launch.address}", f"--temp-dir={launch.temp_dir}",
               f"--resources={json.dumps({host_resource(launch.host): 1})}", f"--memory={launch.memory_bytes}",
               f"--object-store-memory={launch.object_store_bytes}", f"--labels={labels}",
               "--disable-usage-stats", "--include-log-monitor=false",
               f"--min-worker-port={launch.port + WORKER_PORTS[0]}",
               f"--max-worker-port={launch.port + WORKER_PORTS[1]}"]
    command += [f"{flag}={launch.port + offset}" for flag, offset in OFFSETS.items()]
    if launch.num_cpus is not None:
        command.append(f"--num-cpus={launch.num_cpus}")
    if launch.head is not None:
        return [*command, f"--address={launch.head}"]
    command += ["--head", f"--port={launch.port}", "--include-dashboard=false",
                f"--dashboard-port={launch.port + DASHBOARD_OFFSET}"]
    if launch.dead_after is not None:
        command.append(f"--system-config={json.dumps(health_check(launch.dead_after))}")
    return command


def health_check(dead_after: float) -> dict[str, int]:
    """Ray's health-check settings that declare a silent node dead after about `dead_after` s,
    once it has had START_GRACE s to finish starting: a raylet still starting on a loaded machine
    answers late, and one declared dead then never registers (`ray start` times out)."""
    period = max(100, int(dead_after * 1000 / 3))
    return {"health_check_period_ms": period, "health_check_timeout_ms": period, "health_check_failure_threshold": 3,
            "health_check_initial_delay_ms": int(START_GRACE * 1000)}


# Ray's parts sparkctl has no use for, off: its metrics (sparkctl reads the node table), and its
# memory monitor, which kills Ray workers (the host agent among them) when a node's memory runs
# high: on a Spark the engines hold most of it by design, and sparkctl's own watch decides. With
# no log monitor (`start_command`) each node runs one Python process fewer; the agents log to files.
QUIET = {"RAY_enable_metrics_collection": "0", "RAY_memory_monitor_refresh_ms": "0"}


def ray_environment(token_file: Path, base: dict[str, str]) -> dict[str, str]:
    """The environment of every Ray child: token auth on from `token_file`, no usage reporting,
    the parts sparkctl does not use off (QUIET), and nothing inherited that could point Ray at
    another cluster or token."""
    env = {k: v for k, v in base.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    return env | QUIET | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file),
                          "RAY_USAGE_STATS_ENABLED": "0"}


def start(launch: NodeLaunch, *, ray: Sequence[str], env: dict[str, str], deadline: float) -> NodeRecord:
    """Start the node; on any failure stop what the attempt started and say why. A start that
    missed Ray's own fixed wait for its raylet to register (a loaded machine) is tried again, up
    to START_ATTEMPTS times; each has `deadline` s."""
    launch.log_file.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, START_ATTEMPTS + 1):
        code, session = _start_once(launch, start_command(launch, ray=ray), env=env, deadline=deadline)
        if code == 0:
            return NodeRecord(host=launch.host, address=launch.address, head=launch.endpoint,
                              is_head=launch.head is None, temp_dir=str(launch.temp_dir), handle=session.to_dict())
        processes.stop(session, grace=2)
        if code is None or attempt == START_ATTEMPTS or REGISTRATION_MISSED not in _tail(launch.log_file):
            break
    what = f"did not finish within {deadline:g} s" if code is None else f"exited with {code}"
    raylet = launch.temp_dir / "session_latest" / "logs" / "raylet.out"
    raise SparkctlError(f"ray start for host {launch.host!r} at {launch.endpoint} {what} ({attempt} attempt(s)); "
                        f"its processes were stopped. Last lines of {launch.log_file}:\n{_tail(launch.log_file)}\n"
                        f"and of {raylet} (its stack frames left out):\n{_tail(raylet, 12, frames=False)}")


def running(record: NodeRecord) -> list[int]:
    """The pids of the node's processes still running."""
    return [p.pid for p in processes.alive(processes.Session.from_dict(record.handle))]


def stop(record: NodeRecord, *, grace: float = 10.0, kill: bool = False) -> list[int]:
    """Stop exactly the processes this node's start recorded (SIGTERM, then SIGKILL after
    `grace`; `kill`: SIGKILL at once, as a crash would). Returns the pids signalled."""
    sig = signal.SIGKILL if kill else signal.SIGTERM
    stopped = processes.stop(processes.Session.from_dict(record.handle), grace=0 if kill else grace, sig=sig)
    (Path(record.temp_dir) / "ray_current_cluster").unlink(missing_ok=True)  # no later start follows it
    return stopped


def _start_once(launch: NodeLaunch, command: list[str], *, env: dict[str, str], deadline: float
                ) -> tuple[int | None, processes.Session]:
    """One `ray start`: its exit code (None: past the deadline) and the processes it left."""
    _fresh_temp_dir(launch.temp_dir)
    _check_ports(launch)
    with launch.log_file.open("ab") as log:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=env)
    try:
        code: int | None = child.wait(timeout=deadline)
    except subprocess.TimeoutExpired:
        code = None
    return code, processes.recorded(child.pid)


def _fresh_temp_dir(temp_dir: Path) -> None:
    """The node's own temp dir, emptied: a cluster address or session left by an earlier run
    (a crash, a reboot) must not steer or stall this start. The caller has made sure none of
    its own Ray processes still runs."""
    if len(str(temp_dir)) + SESSION_SUFFIX > SOCKET_PATH_MAX:
        raise SparkctlError(f"Ray's temp dir {temp_dir} is too long for its unix sockets (keep it under "
                            f"{SOCKET_PATH_MAX - SESSION_SUFFIX} characters): use a shorter SPARKCTL_STATE_DIR")
    shutil.rmtree(temp_dir, ignore_errors=True)
    temp_dir.mkdir(parents=True, mode=0o700)


def _check_ports(launch: NodeLaunch) -> None:
    """Ray's GCS and raylet listen on every interface: a port another process holds anywhere on
    the machine fails the start after a 30 s timeout, so say so at once."""
    offsets = [*OFFSETS.values(), *(() if launch.head else (0, DASHBOARD_OFFSET))]
    for port in sorted(launch.port + offset for offset in offsets):
        with socket.socket(socket.AF_INET6 if ":" in launch.address else socket.AF_INET) as probe:
            # as Ray's servers bind: connections a killed node left in TIME_WAIT do not hold the port
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("", port))
            except OSError:
                raise SparkctlError(f"port {port} is taken on this machine; a node uses ports {launch.port} to "
                                    f"{launch.port + WORKER_PORTS[1]} (on every interface): pick another first port "
                                    "(--port, or `ray.port` in the fleet file)") from None


def _tail(path: Path, lines: int = 12, *, frames: bool = True) -> str:
    """The file's last `lines` lines; `frames=False` leaves out a crash's stack frames (`(+0x...)`)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    return "\n".join([line for line in text if frames or "(+0x" not in line][-lines:])
