"""Joining and leaving the fleet from this Spark: the steps behind `sparkctl fleet init`, `join`
and `leave`, and where `status` finds the head.

Starting converges from any local state: a node this state dir started and that still runs is
reported, not started twice; a record whose processes are gone is stale and replaced. Leaving
stops only the processes the record names. Effects go through the `FleetBackend`.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from sparkctl.errors import SparkctlError
from sparkctl.fleet import local
from sparkctl.fleet.backend import FleetBackend
from sparkctl.node import NodeRecord
from sparkctl.settings import Settings
from sparkctl.spec.fleet import Fleet, Host


def control_plane(settings: Settings) -> FleetBackend:
    """The fleet's control plane for this instance: Ray, its calls bounded by the settings."""
    from sparkctl.adapters.ray import RayBackend

    return RayBackend(token_file=token_path(settings), timeout=settings.fleet_ray_timeout,
                      namespace=f"sparkctl-{settings.instance}")


def start(backend: FleetBackend, settings: Settings, host: Host, *, head: str | None,
          inventory: bool) -> NodeRecord:
    """Start `host`'s node here: the head when `head` is None, else a worker joining `head`."""
    local.check_local(host.ray.address, f"host {host.name!r}'s Ray address")
    if inventory:
        local.check_local(host.serving.address, f"host {host.name!r}'s serving address")
        local.check_interface(host.serving)
    record_path = settings.fleet_dir / local.RECORD_FILE
    previous = local.read_record(record_path)
    if previous is not None and backend.running(previous):
        pids = " ".join(map(str, backend.running(previous)))
        raise SparkctlError(f"this Spark already runs a fleet node as host {previous.host!r} (head {previous.head}, "
                            f"pids {pids}); run `sparkctl fleet leave` first")
    record = backend.start_node(local.launch_for(host, head=head, settings=settings))
    local.write_record(record_path, record)
    return record


def leave(backend: FleetBackend, settings: Settings) -> tuple[NodeRecord, list[int]] | None:
    """Stop this Spark's node (its recorded processes only); None when it has none."""
    record_path = settings.fleet_dir / local.RECORD_FILE
    record = local.read_record(record_path)
    if record is None:
        return None
    stopped = backend.stop_node(record)
    record_path.unlink(missing_ok=True)
    return record, stopped


def head_endpoint(settings: Settings, fleet: Fleet | None, given: str | None) -> str:
    """The head to ask: `--head`, else the one this Spark joined, else the inventory's `head`."""
    if given:
        return endpoint(given)
    record = local.read_record(settings.fleet_dir / local.RECORD_FILE)
    if record is not None:
        return record.head
    head = fleet.head_host if fleet else None
    if head is None:
        raise SparkctlError("no head to ask: this Spark has not joined a fleet, and the fleet file names no "
                            "`head:`; pass --head ADDR:PORT")
    return head.ray.endpoint


def endpoint(text: str) -> str:
    """`ADDR:PORT` with a literal IP address (`[v6]:PORT` for IPv6): Ray never resolves a name."""
    host, _, port = text.strip().rpartition(":")
    try:
        ipaddress.ip_address(host.strip("[]"))
        if not 1 <= int(port) <= 65535:
            raise ValueError
    except ValueError:
        raise SparkctlError(f"{text!r} is not ADDR:PORT with an IP address (e.g. 192.168.100.10:6379)") from None
    return f"{host}:{int(port)}"


def token_path(settings: Settings) -> Path:
    return settings.fleet_dir / local.TOKEN_FILE


def relay_auth(settings: Settings) -> str:
    """The `Authorization` value for an engine placed on a fleet host (its host's relay asks for it)."""
    return f"Bearer {local.relay_key(token_path(settings))}"
