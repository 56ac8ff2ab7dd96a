"""Ray, the fleet's control plane: start and stop this Spark's node, read the node table, and
place or remove placement groups.

Every call is bounded. `ray start` runs as a child with a deadline (`raynode.py`). Ray's client
calls run in a child too (`adapters/raychild.py`; it and `raystart.py` alone import `ray`): its
C++ client retries an absent GCS for 40 s and then aborts the whole process, which a CLI or a
daemon must not suffer.
Token authentication is always on: the token is read from a 0600 file whose path (not the token)
goes to Ray in its environment, so it is in no command line, log or error. Called by the `fleet`
layer through the `FleetBackend` protocol.

Ray is the `fleet` extra, not a base dependency: `RayBackend` checks once that it is installed and
otherwise says how to add it to this very install, before any child would fail importing it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from sparkctl.adapters import raynode
from sparkctl.errors import NoRoom, SparkctlError, TransientError
from sparkctl.node import (
    AgentAnswer,
    AgentCall,
    AgentSpec,
    Node,
    NodeLaunch,
    NodeRecord,
    NodeState,
    Placement,
    decode,
)

RESULT = "SPARKCTL-RESULT "  # the child's answer: the last stdout line starting with this
UNPLACEABLE = "could not be placed within"
WATCH_EVERY = 0.1  # s between two reads of the node table by `watch`
AUTH_FAILED = ("InvalidAuthToken", "Unauthenticated", "AuthenticationError")
RAY = "ray==2.60.0"  # pyproject's `fleet` extra: one pinned version on every Spark


class RayBackend:
    """The `FleetBackend` on Ray. `timeout` bounds every call; `namespace` holds this instance's
    named placement groups apart from anyone else's."""

    def __init__(self, *, token_file: Path, timeout: float, namespace: str) -> None:
        require_ray()
        self.token_file, self.timeout, self.namespace = token_file, timeout, namespace
        self.launcher: Sequence[str] = raynode.LAUNCHER  # what runs `ray start`

    # -- this Spark's node --------------------------------------------------------------------
    def start_node(self, launch: NodeLaunch) -> NodeRecord:
        """Start the node (`raynode.start`); a joining node first checks that its head answers."""
        if launch.head is not None:
            self._reachable(launch.head)
        env = raynode.ray_environment(self.token_file, dict(os.environ))
        return raynode.start(launch, ray=self.launcher, env=env, deadline=self.timeout + raynode.REGISTRATION_WAIT)

    def running(self, record: NodeRecord) -> list[int]:
        return raynode.running(record)

    def stop_node(self, record: NodeRecord, *, grace: float = 10.0, kill: bool = False) -> list[int]:
        return raynode.stop(record, grace=grace, kill=kill)

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
    def ask_agents(self, head: str, *, local_address: str, hosts: list[str], call: AgentCall, wait: float,
                   ensure: list[AgentSpec] | None = None) -> list[AgentAnswer]:
        """Make `call` on each host's agent at once (after starting the agents of `ensure` that
        do not run yet: idempotent); one typed answer per host, in `hosts` order. A host whose
        agent did not answer within `wait` s, or has none, gets an error, not a value."""
        answer = self._call("agents", beyond=wait, head=head, local_address=local_address, namespace=self.namespace,
                            ensure=[vars(spec) for spec in ensure or []], hosts=hosts, method=call.method,
                            fields=dataclasses.asdict(call), wait=wait)
        return [AgentAnswer(host=h, value=decode(call, answer[h]["value"])) if "value" in answer[h]
                else AgentAnswer(host=h, error=answer[h]["error"]) for h in hosts]

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
        env = raynode.ray_environment(self.token_file, dict(os.environ))
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


def require_ray() -> None:
    """Refuse, saying what to install, when this install of sparkctl has no Ray (the `fleet` extra).
    PyPI's `sparkctl` is another project: the advice adds Ray to this environment, never by name."""
    if importlib.util.find_spec("ray") is not None:
        return
    prefix = Path(sys.prefix)
    if (prefix / "pipx_metadata.json").is_file():  # pipx's venv, named after the package
        how = f"pipx inject {prefix.name} '{RAY}'"
    else:
        how = f"{sys.executable} -m pip install '{RAY}'"
    raise SparkctlError(f"the fleet runs on Ray, which this install of sparkctl leaves out (the `fleet` extra); "
                        f"add it with: {how}")


def _nodes(answer: list[dict[str, Any]]) -> list[Node]:
    return [Node(node_id=n["node_id"], address=n["address"], state=NodeState(n["state"]), head=n["head"],
                 resources=n["resources"], labels=n["labels"], died_at=n.get("died_at")) for n in answer]


def _child_error(op: str, head: str, output: str, token_file: Path) -> SparkctlError:
    if UNPLACEABLE in output:
        return NoRoom(next(line for line in output.splitlines() if UNPLACEABLE in line).split("Error: ", 1)[-1])
    if any(marker in output for marker in AUTH_FAILED):
        return SparkctlError(f"the Ray head at {head} refused this Spark's token ({token_file}): copy the head's "
                             "token file to that path (0600) and retry")
    last = "\n".join(output.strip().splitlines()[-8:])
    return SparkctlError(f"Ray {op} against {head} failed:\n{last}")
