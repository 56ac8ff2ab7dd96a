"""The fleet inventory, `fleet.yaml`: the Sparks of a fleet, as the owner declares them.

Each host has a name, the interface and address its serving traffic uses (the CX-7 one), a
memory ceiling (`110GiB` or `90%` of the host's memory), the address and first port of its Ray
node, and optionally the URL of its Docker engine. Every address is written out: sparkctl never
lets Ray pick one from the default route. `load_fleet` turns any problem into a `SpecError`
naming the file and the key; the CLI's `fleet` commands are the callers.

```yaml
head: spark-a
hosts:
  - name: spark-a
    serving: {interface: enp1s0f0np0, address: 192.168.100.10}
    memory: 110GiB
    ray: {address: 192.168.100.10, port: 6379}
```
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from sparkctl.errors import SpecError
from sparkctl.spec import yamlfile
from sparkctl.spec.base import Name, Spec
from sparkctl.spec.load import _validate

GIB = 1 << 30
MEMORY = re.compile(r"^(?P<value>\d+(\.\d+)?)\s*(?P<unit>GiB|%)$")
# Ports a node uses from its first one: the head's GCS at +0, the node's own services at +1..+15,
# and Ray's worker processes at +16 and up (`adapters.ray`).
PORT_BLOCK = 256


def _address(value: str) -> str:
    """A literal IP address: never a host name, which Ray would resolve on its own."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address; write the address itself (e.g. 192.168.100.10), "
                         "not a host name") from None


def _memory(value: object) -> str:
    if not isinstance(value, str | int | float):
        raise ValueError("write GiB (`110GiB`) or a share of the host's memory (`90%`)")
    value = str(value)
    found = MEMORY.match(value.strip())
    if not found:
        raise ValueError(f"{value!r}: write GiB (`110GiB`) or a share of the host's memory (`90%`)")
    amount = float(found["value"])
    if amount <= 0 or (found["unit"] == "%" and amount > 100):
        raise ValueError(f"{value!r}: must be above 0 (and at most 100%)")
    return value.strip()


Address = Annotated[str, AfterValidator(_address)]
Interface = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}$")]  # Linux: 15 characters
DockerUrl = Annotated[str, Field(pattern=r"^(unix:///\S+|tcp://\S+|ssh://\S+)$")]


class Serving(Spec):
    interface: Interface
    address: Address
    # The host's RDMA device on that link (e.g. rocep1s0f1, as `ibv_devices` names it): NCCL_IB_HCA
    # for the ranks of a multi-node stack; unset: NCCL picks one.
    hca: Interface | None = None


class RayNode(Spec):
    address: Address
    # The head's GCS port; a node's first port (it uses PORT_BLOCK ports from here).
    port: Annotated[int, Field(ge=1, le=65536 - PORT_BLOCK)] = 6379

    @property
    def endpoint(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"


class Host(Spec):
    name: Name
    serving: Serving
    memory: Annotated[str, BeforeValidator(_memory)]
    ray: RayNode
    docker: DockerUrl | None = None

    def memory_bytes(self, total_bytes: int) -> int:
        """The ceiling in bytes, on a host with `total_bytes` of memory."""
        found = MEMORY.match(self.memory)
        assert found is not None  # validated
        amount = float(found["value"])
        return int(amount * GIB) if found["unit"] == "GiB" else int(total_bytes * amount / 100)


class Fleet(Spec):
    hosts: tuple[Host, ...] = Field(min_length=1, max_length=64)
    head: Name | None = None  # the host `sparkctl fleet status` asks, when this Spark has not joined

    @model_validator(mode="after")
    def _consistent(self) -> Fleet:
        names = [h.name for h in self.hosts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"host {twice[0]!r} is listed more than once")
        _no_overlap(self.hosts)
        if self.head is not None and self.head not in names:
            raise ValueError(f"head {self.head!r} is not one of the hosts: {', '.join(names)}")
        return self

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise SpecError("fleet.yaml", "hosts", f"no host named {name!r}; hosts: {', '.join(self.names)}")

    @property
    def names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def head_host(self) -> Host | None:
        return self.host(self.head) if self.head else None


def load_fleet(path: Path) -> Fleet:
    """Read and validate `fleet.yaml`; a missing file says how to write one."""
    if not path.is_file():
        raise SpecError(str(path), "", "no fleet inventory here; write one with a `hosts:` list (see "
                                       "`sparkctl fleet --help`), or point SPARKCTL_FLEET_FILE at yours")
    data = yamlfile.read(path)
    if not isinstance(data, dict):
        raise SpecError(str(path), "", "a fleet file holds one mapping with a `hosts:` list")
    return _validate(Fleet, data, path)


def _no_overlap(hosts: tuple[Host, ...]) -> None:
    """Nodes on one machine need port blocks that do not overlap, since Ray listens on every
    interface: one address, or loopback addresses (several "Sparks" on one machine, in tests)."""
    taken: dict[str, list[tuple[int, str]]] = {}
    for host in hosts:
        machine = "loopback" if ipaddress.ip_address(host.ray.address).is_loopback else host.ray.address
        for port, other in taken.get(machine, []):
            if abs(port - host.ray.port) < PORT_BLOCK:
                raise ValueError(f"hosts {other!r} and {host.name!r} are on one machine ({machine}) with Ray ports "
                                 f"{port} and {host.ray.port}: a node uses {PORT_BLOCK} ports from its own, "
                                 "so keep them that far apart")
        taken.setdefault(machine, []).append((host.ray.port, host.name))
