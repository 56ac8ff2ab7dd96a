"""This Spark's place in the fleet: which inventory host it is, the checks on its addresses, the
Ray token it holds, and the record of the node it started.

An address is this machine's when the kernel lets a socket bind it: the kernel's own answer,
with no interface parsing and no name resolution (a default route is never consulted). The
token and the record live in the state dir's `fleet/`, 0600. Called by `sparkctl fleet`; the
start itself goes through the `FleetBackend`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import stat
import subprocess
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from sparkctl.deploy.memory import usable_memory
from sparkctl.errors import SparkctlError
from sparkctl.node import LABEL_ADDRESS, LABEL_INTERFACE, LABEL_VALUE, NodeLaunch, NodeRecord
from sparkctl.settings import Settings
from sparkctl.spec.fleet import Fleet, Host, RayNode, Serving
from sparkctl.state import secret

TOKEN_FILE = "ray-token"
RECORD_FILE = "node.json"
LOG_FILE = "ray-start.log"


def is_local(address: str) -> bool:
    """Whether `address` belongs to one of this machine's interfaces (loopback's /8 included)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def check_local(address: str, what: str) -> None:
    if not is_local(address):
        raise SparkctlError(f"{what} {address} is not an address of this machine's interfaces; give the address "
                            "of the interface Ray should use here (`ip -br addr` lists them): sparkctl never lets "
                            "Ray pick one from the default route")


def check_interface(serving: Serving) -> None:
    names = {name for _, name in socket.if_nameindex()}
    if serving.interface not in names:
        raise SparkctlError(f"serving interface {serving.interface!r} does not exist here (interfaces: "
                            f"{', '.join(sorted(names))}); fix `serving.interface` in the fleet file")


def check_on_interface(interface: str, address: str, host: str) -> None:
    """Refuse when `interface` is absent here or does not hold `address` (a rank of a multi-node
    group binds and advertises exactly that pair; nothing is guessed from the default route)."""
    check_interface(Serving(interface=interface, address=address))
    listed = subprocess.run(["ip", "-j", "addr", "show", "dev", interface], capture_output=True, text=True)
    held = {a.get("local") for link in json.loads(listed.stdout or "[]") for a in link.get("addr_info", [])}
    if address not in held:
        holds = ", ".join(sorted(filter(None, held))) or "no address"
        raise SparkctlError(f"host {host}: interface {interface} holds {holds}, not {address}; fix `serving` for "
                            f"{host} in the fleet file")


def choose_host(fleet: Fleet | None, *, name: str | None, address: str | None, port: int | None,
                local: Callable[[str], bool] = is_local) -> Host:
    """The host this Spark starts as: the named one, else the one whose Ray address is here.
    Without an inventory, `--address` makes a host of this machine's name (memory: the ceiling
    of the settings is applied by the caller). `--address`/`--port` override the inventory's."""
    if fleet is None:
        if address is None:
            raise SparkctlError("no fleet inventory and no --address: give the address Ray should use on this "
                                "Spark (--address), or write fleet.yaml")
        return Host(name=name or _hostname(), serving=Serving(interface="lo", address=address), memory="90%",
                    ray=RayNode(address=address, port=port or 6379))
    host = fleet.host(name) if name else _the_local_one(fleet, local)
    if address is None and port is None:
        return host
    ray = RayNode(address=address or host.ray.address, port=port or host.ray.port)
    return host.model_copy(update={"ray": ray})


def memory_total(settings: Settings) -> int:
    """A Spark's memory in bytes, which ceilings and stacks' fractions are of: its usable memory as
    this Spark's daemon last measured it (no measuring here: engines may run), else MemTotal."""
    return usable_memory(settings, engines_running=True)


def launch_for(host: Host, *, head: str | None, settings: Settings) -> NodeLaunch:
    """What to start for `host` (pure but for reading MemTotal when the ceiling is a share)."""
    total = memory_total(settings)
    labels = {LABEL_INTERFACE: host.serving.interface, LABEL_ADDRESS: host.serving.address}
    return NodeLaunch(host=host.name, address=host.ray.address, port=host.ray.port, head=head,
                      memory_bytes=host.memory_bytes(total), temp_dir=settings.fleet_dir / "ray",
                      log_file=settings.fleet_dir / LOG_FILE,
                      object_store_bytes=settings.fleet_object_store_mib << 20,
                      labels={k: v for k, v in labels.items() if LABEL_VALUE.match(v)},
                      num_cpus=settings.fleet_num_cpus, dead_after=settings.fleet_dead_after)


# -- the token -------------------------------------------------------------------------------------
def ensure_token(path: Path) -> None:
    """A fresh token for a new fleet, unless this Spark already has one (then it is kept)."""
    if not secret.make(path):
        check_token(path)


def install_token(source: Path, path: Path) -> None:
    """Copy the head's token (brought over by the owner) into this Spark's state dir, 0600."""
    check_token(source)
    token = source.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token)


def relay_key(path: Path) -> str:
    """The credential the head's gateway shows each host's engine relays (`gateway/relay.py`):
    derived from the fleet's Ray token, which every host of the fleet holds (0600)."""
    check_token(path)
    return hmac.new(path.read_text().strip().encode(), b"sparkctl engine relay", hashlib.sha256).hexdigest()


def check_token(path: Path) -> None:
    try:
        mode = path.stat().st_mode
    except OSError:
        raise SparkctlError(f"no Ray token at {path}: copy the head Spark's {TOKEN_FILE} (from its state dir's "
                            "fleet/) here, or pass --token-file") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SparkctlError(f"the Ray token {path} is readable by others (mode {stat.filemode(mode)}): "
                            f"run `chmod 600 {path}`")
    if len(path.read_text().strip()) < 32:
        raise SparkctlError(f"the Ray token {path} is too short (under 32 characters); copy the head's token file")


# -- the record ------------------------------------------------------------------------------------
def read_record(path: Path) -> NodeRecord | None:
    try:
        return NodeRecord(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as e:
        raise SparkctlError(f"{path} is not a node record ({e}); stop any Ray process you started by hand, "
                            "then delete the file") from None


def write_record(path: Path, record: NodeRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_suffix(".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(record), out, indent=1)
    partial.replace(path)


def _the_local_one(fleet: Fleet, local: Callable[[str], bool]) -> Host:
    here = [h for h in fleet.hosts if local(h.ray.address)]
    if len(here) == 1:
        return here[0]
    if not here:
        raise SparkctlError(f"no host of the fleet file has its Ray address on this machine "
                            f"({', '.join(f'{h.name}: {h.ray.address}' for h in fleet.hosts)}); name it with --host")
    raise SparkctlError(f"several hosts of the fleet file have their Ray address here "
                        f"({', '.join(h.name for h in here)}); name the one to start with --host")


def _hostname() -> str:
    name = socket.gethostname().split(".")[0].lower()
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:63] or "spark"
