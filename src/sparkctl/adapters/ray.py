"""Ray, the fleet's control plane: start and stop this Spark's node, read the node table, and
place or remove placement groups.

Every call is bounded. `ray start` runs as a child with a deadline, as a new session leader so
that the processes it leaves are recorded (`adapters.processes`) and later stopped by pid. Ray's
client calls run in a child too (`adapters/raychild.py`, the only module that imports `ray`): its
C++ client retries an absent GCS for 40 s and then aborts the whole process, which a CLI or a
daemon must not suffer.
Token authentication is always on: the token is read from a 0600 file whose path (not the token)
goes to Ray in its environment, so it is in no command line, log or error. Every address is
explicit, and stale state in the node's own temp dir is cleared before a start. Called by the
`fleet` layer through the `FleetBackend` protocol.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparkctl.adapters import processes
from sparkctl.errors import NoRoom, SparkctlError, TransientError
from sparkctl.node import (
    LABEL_HOST,
    AgentAnswer,
    AgentSpec,
    Node,
    NodeLaunch,
    NodeRecord,
    NodeState,
    Placement,
    host_resource,
)

RESULT = "SPARKCTL-RESULT "  # the child's answer: the last stdout line starting with this
SOCKET_PATH_MAX = 107  # AF_UNIX; Ray puts `session_<stamp>_<pid>/sockets/plasma_store` under its temp dir
SESSION_SUFFIX = 62
# A node's ports, from its first one (spec.fleet.PORT_BLOCK of them): +0 is the head's GCS.
OFFSETS = {"--node-manager-port": 1, "--object-manager-port": 2, "--dashboard-agent-listen-port": 3,
           "--dashboard-agent-grpc-port": 4, "--metrics-export-port": 5, "--runtime-env-agent-port": 6}
WORKER_PORTS = (16, 255)
DASHBOARD_OFFSET = 7  # the head's minimal dashboard process binds one even with the dashboard off
UNPLACEABLE = "could not be placed within"
WATCH_EVERY = 0.1  # s between two reads of the node table by `watch`
REGISTRATION_MISSED = "timed out during startup"  # Ray's message when its raylet did not register in time
REGISTRATION_WAIT = 30.0  # s: Ray's fixed wait for that (ray/_private/node.py)
START_ATTEMPTS = 2
START_GRACE = 10.0  # s after a node joins before the head's health checks may declare it dead
AUTH_FAILED = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError")


def start_command(launch: NodeLaunch, *, ray_bin: Path) -> list[str]:
    """The `ray start` command line for `launch`: every address and port explicit, no token."""
    command = [str(ray_bin), "start", f"--node-ip-address={launch.address}", f"--temp-dir={launch.temp_dir}",
               f"--resources={json.dumps({host_resource(launch.host): 1})}", f"--memory={launch.memory_bytes}",
               f"--object-store-memory={launch.object_store_bytes}", f"--labels={_labels(launch)}",
               "--disable-usage-stats", f"--min-worker-port={launch.port + WORKER_PORTS[0]}",
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


def ray_environment(token_file: Path, base: dict[str, str]) -> dict[str, str]:
    """The environment of every Ray child: token auth on from `token_file`, no usage reporting,
    and nothing inherited that could point Ray at another cluster or token."""
    env = {k: v for k, v in base.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    return env | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file), "RAY_USAGE_STATS_ENABLED": "0"}


class RayBackend:
    """The `FleetBackend` on Ray. `timeout` bounds every call; `namespace` holds this instance's
    named placement groups apart from anyone else's."""

    def __init__(self, *, token_file: Path, timeout: float, namespace: str) -> None:
        self.token_file, self.timeout, self.namespace = token_file, timeout, namespace
        self.ray_bin = Path(sys.executable).parent / "ray"

    # -- this Spark's node --------------------------------------------------------------------
    def start_node(self, launch: NodeLaunch) -> NodeRecord:
        """Start the node; on any failure stop what the attempt started and say why. A start
        that missed Ray's own fixed wait for its raylet to register (a loaded machine) is tried
        again, up to START_ATTEMPTS times."""
        if launch.head is not None:
            self._reachable(launch.head)
        launch.log_file.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, START_ATTEMPTS + 1):
            code, session = self._start_once(launch)
            if code == 0:
                return NodeRecord(host=launch.host, address=launch.address, head=launch.endpoint,
                                  is_head=launch.head is None, temp_dir=str(launch.temp_dir),
                                  handle=session.to_dict())
            processes.stop(session, grace=2)
            if code is None or attempt == START_ATTEMPTS or REGISTRATION_MISSED not in _tail(launch.log_file):
                break
        what = f"did not finish within {self._start_deadline:g} s" if code is None else f"exited with {code}"
        raylet = launch.temp_dir / "session_latest" / "logs" / "raylet.out"
        raise SparkctlError(f"ray start for host {launch.host!r} at {launch.endpoint} {what} ({attempt} attempt(s)); "
                            f"its processes were stopped. Last lines of {launch.log_file}:\n{_tail(launch.log_file)}\n"
                            f"and of {raylet} (its stack frames left out):\n{_tail(raylet, 12, frames=False)}")

    def _start_once(self, launch: NodeLaunch) -> tuple[int | None, processes.Session]:
        """One `ray start`: its exit code (None: past the deadline) and the processes it left."""
        _fresh_temp_dir(launch.temp_dir)
        _check_ports(launch)
        with launch.log_file.open("ab") as log:
            child = subprocess.Popen(start_command(launch, ray_bin=self.ray_bin), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=ray_environment(self.token_file, dict(os.environ)))
        try:
            code: int | None = child.wait(timeout=self._start_deadline)
        except subprocess.TimeoutExpired:
            code = None
        return code, processes.recorded(child.pid)

    @property
    def _start_deadline(self) -> float:
        """`ray start` waits up to REGISTRATION_WAIT s for its raylet on top of its own work."""
        return self.timeout + REGISTRATION_WAIT

    def running(self, record: NodeRecord) -> list[int]:
        """The pids of the node's processes still running."""
        return [p.pid for p in processes.alive(processes.Session.from_dict(record.handle))]

    def stop_node(self, record: NodeRecord, *, grace: float = 10.0, kill: bool = False) -> list[int]:
        """Stop exactly the processes this node's start recorded (SIGTERM, then SIGKILL after
        `grace`; `kill`: SIGKILL at once, as a crash would). Returns the pids signalled."""
        sig = signal.SIGKILL if kill else signal.SIGTERM
        stopped = processes.stop(processes.Session.from_dict(record.handle), grace=0 if kill else grace, sig=sig)
        _forget_cluster(Path(record.temp_dir))
        return stopped

    # -- the cluster ----------------------------------------------------------------------------
    def nodes(self, head: str) -> list[Node]:
        """Every node in the head's table, alive or dead."""
        return _nodes(self._call("nodes", head=head))

    def watch(self, head: str) -> NodeWatch:
        """A child that reads the head's node table every 0.1 s and reports each change."""
        self._reachable(head)
        return NodeWatch(subprocess.Popen([sys.executable, "-m", "sparkctl.adapters.raychild", "watch"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True, env=self._child_environment()), head)

    def placement(self, head: str, *, local_address: str, name: str) -> Placement | None:
        """Where the named placement group's bundles are now; None when there is none."""
        answer = self._call("table", head=head, local_address=local_address, name=name, namespace=self.namespace)
        if answer is None:
            return None
        return Placement(name=name, strategy=answer["strategy"], nodes=tuple(answer["nodes"]), placed=answer["placed"])

    def place(self, head: str, *, local_address: str, name: str, bundles: list[dict[str, float]],
              strategy: str, wait: float | None = None) -> Placement:
        """Create the named, detached placement group (or find it) and wait until it is placed;
        one that cannot be placed within `wait` (default: the timeout) is removed and refused."""
        limit = self.timeout - 5  # the child must answer before its own deadline
        answer = self._call("place", head=head, local_address=local_address, name=name, bundles=bundles,
                            strategy=strategy, namespace=self.namespace,
                            wait=max(1.0, limit if wait is None else min(wait, limit)))
        return Placement(name=name, strategy=strategy, nodes=tuple(answer["nodes"]))

    def free_memory(self, head: str, *, local_address: str) -> dict[str, int]:
        """Each live node's unreserved memory in bytes, by node id."""
        answer = self._call("free", head=head, local_address=local_address, namespace=self.namespace)
        return {node: int(memory) for node, memory in answer.items()}

    def remove(self, head: str, *, local_address: str, name: str) -> bool:
        """Remove the named placement group; False when there was none."""
        return bool(self._call("remove", head=head, local_address=local_address, name=name, namespace=self.namespace))

    # -- host agents ------------------------------------------------------------------------------
    def ask_agents(self, head: str, *, local_address: str, hosts: list[str], method: str, args: list[Any] | None = None,
                   wait: float, ensure: list[AgentSpec] | None = None) -> list[AgentAnswer]:
        """Call `method(*args)` on each host's agent at once (after starting the agents of
        `ensure` that do not run yet: idempotent); one answer per host, in `hosts` order. A host
        whose agent did not answer within `wait` s, or has none, gets an error, not a value."""
        answer = self._call("agents", beyond=wait, head=head, local_address=local_address, namespace=self.namespace,
                            ensure=[vars(spec) for spec in ensure or []], hosts=hosts, method=method,
                            args=args or [], wait=wait)
        return [AgentAnswer(host=h, value=answer[h].get("value"), error=answer[h].get("error")) for h in hosts]

    # -- helpers ----------------------------------------------------------------------------------
    def _call(self, op: str, *, beyond: float = 0.0, **args: Any) -> Any:
        """Run `op` in a child; it has the timeout, plus `beyond` s of work it waits for (an agent's deploy)."""
        self._reachable(args["head"])
        env = self._child_environment()
        limit = self.timeout + beyond
        try:
            done = subprocess.run([sys.executable, "-m", "sparkctl.adapters.raychild", op], input=json.dumps(args),
                                  capture_output=True, text=True, timeout=limit, env=env)
        except subprocess.TimeoutExpired:
            raise TransientError(f"Ray {op} against {args['head']} did not answer within {limit:g} s; check "
                                 "the head with `sparkctl fleet status`, or raise SPARKCTL_FLEET_RAY_TIMEOUT") from None
        lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
        if done.returncode == 0 and lines:
            return json.loads(lines[-1].removeprefix(RESULT))
        raise _child_error(op, args["head"], done.stdout + done.stderr, self.token_file)

    def _child_environment(self) -> dict[str, str]:
        """A child's: Ray's, with its client giving up on a lost head in half our timeout."""
        env = ray_environment(self.token_file, dict(os.environ))
        return env | {"RAY_gcs_rpc_server_reconnect_timeout_s": str(max(1, int(self.timeout / 2)))}

    def _reachable(self, endpoint: str) -> None:
        """A plain TCP connect first: an absent head is a clear error in a second, not a Ray retry loop."""
        host, _, port = endpoint.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=min(5.0, self.timeout)).close()
        except OSError as e:
            raise TransientError(f"no Ray head answers at {endpoint} ({e.strerror or e}); start it with "
                                 "`sparkctl fleet init` on the head Spark, or check the address") from None


class NodeWatch:
    """The `watch` child's reports as node tables; ends (TransientError) when the child does."""

    def __init__(self, child: subprocess.Popen, head: str) -> None:
        self.child, self.head = child, head
        assert child.stdin is not None
        child.stdin.write(json.dumps({"head": head}))
        child.stdin.close()

    def __iter__(self) -> Iterator[list[Node]]:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            if line.startswith(RESULT):
                yield _nodes(json.loads(line.removeprefix(RESULT)))
        self.child.wait()
        raise TransientError(f"lost the Ray head at {self.head} (its node table stopped answering)")

    def close(self) -> None:
        self.child.kill()
        self.child.wait()


def _nodes(answer: list[dict[str, Any]]) -> list[Node]:
    return [Node(node_id=n["node_id"], address=n["address"], state=NodeState(n["state"]), head=n["head"],
                 resources=n["resources"], labels=n["labels"], died_at=n.get("died_at")) for n in answer]


def _labels(launch: NodeLaunch) -> str:
    return ",".join(f"{k}={v}" for k, v in {LABEL_HOST: launch.host, **launch.labels}.items())


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


def _forget_cluster(temp_dir: Path) -> None:
    (temp_dir / "ray_current_cluster").unlink(missing_ok=True)


def _tail(path: Path, lines: int = 12, *, frames: bool = True) -> str:
    """The file's last `lines` lines; `frames=False` leaves out a crash's stack frames (`(+0x...)`)."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no output)"
    return "\n".join([line for line in text if frames or "(+0x" not in line][-lines:])


def _child_error(op: str, head: str, output: str, token_file: Path) -> SparkctlError:
    if UNPLACEABLE in output:
        return NoRoom(next(line for line in output.splitlines() if UNPLACEABLE in line).split("Error: ", 1)[-1])
    if any(marker in output for marker in AUTH_FAILED):
        return SparkctlError(f"the Ray head at {head} refused this Spark's token ({token_file}): copy the head's "
                             "token file to that path (0600) and retry")
    last = "\n".join(output.strip().splitlines()[-8:])
    return SparkctlError(f"Ray {op} against {head} failed:\n{last}")
