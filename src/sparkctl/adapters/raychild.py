"""The child process of the Ray adapter (`adapters/ray.py`), which with `raystart.py` alone imports `ray`:
`python -m sparkctl.adapters.raychild OP` reads its arguments as JSON on stdin, does one thing
against the head (the node table, a placement group, the host agents; or watches the node
table) and prints its answer as the last line starting with RESULT. Ray's C++ client aborts the
whole process when the GCS stays away, which only this child suffers."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from sparkctl.adapters.ray import RESULT, UNPLACEABLE, WATCH_EVERY
from sparkctl.node import AGENT_CLASS, LABEL_HOST, NodeState, agent_name


def _child(op: str, args: dict[str, Any]) -> Any:
    if op == "nodes":
        return _child_nodes(args["head"])
    if op == "watch":
        return _child_watch(args["head"])
    if op == "agents":
        return _child_agents(args)
    return _child_driver(op, args)


def _child_agents(args: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Ensure the agents asked for (detached, named, pinned to their host by its node label and
    restarted by Ray when a node with that label comes back), then call one method on each host's.
    A label, not a share of `spark:<host>`: the agent must not take from the one unit a placement
    bundle reserves, nor be kept off its host by a placement holding that unit."""
    import importlib

    import ray

    module, _, name = AGENT_CLASS.partition(":")
    host_agent = getattr(importlib.import_module(module), name)  # above this layer: named, not imported
    namespace = args["namespace"]
    ray.init(address=args["head"], _node_ip_address=args["local_address"], namespace=namespace,
             logging_level="ERROR", log_to_driver=False, configure_logging=False)
    actor_class = ray.remote(host_agent)
    for spec in args["ensure"]:
        actor_class.options(name=agent_name(spec["host"]), namespace=namespace, lifetime="detached",
                            get_if_exists=True, label_selector={LABEL_HOST: spec["host"]}, num_cpus=0,
                            max_restarts=-1, max_concurrency=4).remote(**spec)
    answers: dict[str, dict[str, Any]] = {}
    pending: dict[str, Any] = {}
    for host in args["hosts"]:
        try:
            pending[host] = ray.get_actor(agent_name(host), namespace=namespace)
        except ValueError:
            answers[host] = {"error": f"no agent runs for host {host!r}: start its node (`sparkctl fleet join` "
                                      "on that Spark), then retry"}
    answers.update(_calls(ray, pending, args["method"], args["fields"], args["wait"]))
    return answers


def _calls(ray: Any, actors: dict[str, Any], method: str, fields: dict[str, Any], wait: float
           ) -> dict[str, dict[str, Any]]:
    """Each host's answer to one call, within `wait`. An agent Ray is restarting (its node just came
    back) refuses calls until it runs again: such a call is sent again, as it never reached the agent."""
    import time

    from ray.exceptions import ActorUnavailableError

    deadline = time.monotonic() + wait
    answers: dict[str, dict[str, Any]] = {}
    pending = {host: actor.call.remote(method, fields) for host, actor in actors.items()}
    while pending:
        left = deadline - time.monotonic()
        ready, _ = ray.wait(list(pending.values()), num_returns=1, timeout=max(left, 0))
        if not ready:
            break
        host = next(host for host, ref in pending.items() if ref == ready[0])
        try:
            answers[host] = {"value": ray.get(pending.pop(host), timeout=1)}
        except Exception as e:  # noqa: BLE001 - any failure is that host's answer, not the whole call's
            if not isinstance(getattr(e, "cause", None) or e, ActorUnavailableError):
                answers[host] = _agent_error(e)
                continue
            time.sleep(min(0.5, max(deadline - time.monotonic(), 0)))
            pending[host] = actors[host].call.remote(method, fields)
    for host in pending:
        answers[host] = {"error": f"its agent did not answer within {wait:g} s (host down, or Ray has not seen "
                                  "it back)"}
    return answers


def _agent_error(e: Exception) -> dict[str, Any]:
    cause = getattr(e, "cause", None) or e
    if isinstance(cause, RuntimeError):  # the agent's own refusal (`HostAgent.call`), whole
        return {"error": str(cause)[:2000]}
    text = " ".join(line.strip() for line in str(cause).splitlines() if line.strip())
    return {"error": f"{type(cause).__name__}: {text}"[:500]}


def _child_nodes(head: str, client: Any = None) -> list[dict[str, Any]]:
    from ray._raylet import GcsClient

    table = (client or GcsClient(address=head)).get_all_node_info(timeout=10)
    return [{"node_id": node_id.hex(), "address": info.node_manager_address, "head": bool(info.is_head_node),
             "state": NodeState.ALIVE if info.state == 0 else NodeState.DEAD,
             "died_at": info.end_time_ms / 1000 if info.state != 0 and info.end_time_ms else None,
             "resources": dict(info.resources_total), "labels": dict(info.labels)} for node_id, info in table.items()]


def _child_watch(head: str) -> None:
    """Print the node table whenever a node's state changes; never returns (killed by the parent)."""
    import time

    from ray._raylet import GcsClient

    client, last = GcsClient(address=head), None
    while True:
        table = _child_nodes(head, client)
        states = sorted((n["node_id"], n["state"]) for n in table)
        if states != last:
            print(RESULT + json.dumps(table), flush=True)
            last = states
        time.sleep(WATCH_EVERY)


def _child_driver(op: str, args: dict[str, Any]) -> Any:
    import ray
    from ray.util import placement_group_table
    from ray.util.placement_group import get_placement_group, placement_group, remove_placement_group

    ray.init(address=args["head"], _node_ip_address=args["local_address"], namespace=args["namespace"],
             logging_level="ERROR", log_to_driver=False, configure_logging=False)
    if op == "table":
        try:
            group = get_placement_group(args["name"])
        except ValueError:
            return None
        table = placement_group_table(group)
        nodes = [table["bundles_to_node_id"].get(i) or "" for i in range(len(table["bundles"]))]
        return {"strategy": table["strategy"], "nodes": nodes, "placed": table["state"] == "CREATED" and all(nodes)}
    if op == "free":
        from ray._private.state import available_resources_per_node

        return {node: free.get("memory", 0) for node, free in available_resources_per_node().items()}
    if op == "remove":
        try:
            group = get_placement_group(args["name"])
        except ValueError:
            return False
        remove_placement_group(group)
        return True
    try:
        group = get_placement_group(args["name"])
    except ValueError:
        group = placement_group(args["bundles"], strategy=args["strategy"], name=args["name"], lifetime="detached")
    if not group.wait(timeout_seconds=args["wait"]):
        remove_placement_group(group)
        raise RuntimeError(f"placement group {args['name']!r} ({args['strategy']} over {args['bundles']}) "
                           f"{UNPLACEABLE} {args['wait']:g} s: no set of nodes has those resources free")
    table = placement_group_table(group)
    return {"nodes": [table["bundles_to_node_id"][i] for i in range(len(args["bundles"]))]}


if __name__ == "__main__":
    answer = _child(sys.argv[1], json.loads(sys.stdin.read()))
    print(RESULT + json.dumps(answer), flush=True)
    if sys.argv[1] == "agents":
        os._exit(0)  # calls left waiting on a dead host's agent must not hold the driver's shutdown
