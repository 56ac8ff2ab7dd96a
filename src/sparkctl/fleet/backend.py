"""What sparkctl needs from a fleet's control plane, as a protocol: start and stop this Spark's
node, read every node's state, place or remove a group of resource bundles across nodes, and call
the host agents that own each host's containers.

`adapters.ray.RayBackend` implements it; a Kubernetes backend (LeaderWorkerSet) could too,
without a change to the CLI or the fleet layer, which only speak this protocol.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from sparkctl.node import AgentAnswer, AgentCall, AgentSpec, Node, NodeLaunch, NodeRecord, Placement


class NodeWatch(Protocol):
    def __iter__(self) -> Iterator[list[Node]]: ...

    def close(self) -> None: ...


class FleetBackend(Protocol):
    def start_node(self, launch: NodeLaunch) -> NodeRecord:
        """Start this Spark's node as `launch` describes; return the record `stop_node` needs."""

    def running(self, record: NodeRecord) -> list[int]:
        """The pids of the recorded node's processes that still run."""

    def stop_node(self, record: NodeRecord, *, grace: float = 10.0, kill: bool = False) -> list[int]:
        """Stop exactly the recorded node's processes; return the pids signalled."""

    def nodes(self, head: str) -> list[Node]:
        """Every node the control plane at `head` knows, alive or dead."""

    def place(self, head: str, *, local_address: str, name: str, bundles: list[dict[str, float]],
              strategy: str, wait: float | None = None) -> Placement:
        """Reserve `bundles` across nodes (`STRICT_SPREAD`, `PACK`, ...), or raise `NoRoom`."""

    def watch(self, head: str) -> NodeWatch:
        """The node table each time a node's state changes (first: the table as it is)."""

    def placement(self, head: str, *, local_address: str, name: str) -> Placement | None:
        """Where a placement's bundles are now (the backend re-places those of a dead node), or None."""

    def free_memory(self, head: str, *, local_address: str) -> dict[str, int]:
        """Each live node's unreserved `memory` resource in bytes, by node id."""

    def remove(self, head: str, *, local_address: str, name: str) -> bool:
        """Release a placement; False when there was none."""

    def ask_agents(self, head: str, *, local_address: str, hosts: list[str], call: AgentCall, wait: float,
                   ensure: list[AgentSpec] | None = None) -> list[AgentAnswer]:
        """Start the agents of `ensure` unless they run (idempotent), then make `call` on each
        host's agent; one answer per host (the call's typed answer, or the error that host gave
        or its silence)."""
