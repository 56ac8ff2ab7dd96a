"""A throwaway sparkctl instance for the tests, the demo and the benchmarks, safe beside an
owner's live stacks: its own instance name, every stack port shifted to a free range, its own
gateway port, and a cleanup that removes only that instance's containers.

Used by tests/conftest.py, scripts/demo.py and tests/perf/world.py. Stdlib and the Docker CLI
only, like the rest of the sim package.
"""

from __future__ import annotations

import random
import socket
import subprocess
import uuid

# The shipped stacks' engine ports, and the ports tests give their own stacks, lie in this window.
STACK_PORTS = range(8000, 8200)
# Shifted ports land in 10000-30000: clear of the shipped ones and below Linux's ephemeral range
# (32768+), where the kernel picks the local ports of outgoing connections.
OFFSETS = range(2000, 21800, 200)


def environment(prefix: str, *, beside: dict[str, str] | None = None) -> dict[str, str]:
    """`SPARKCTL_*` settings for a fresh instance named `<prefix>-<random>`; `beside`: another
    sandbox's settings whose ports (chosen, maybe not yet bound) must not be reused."""
    beside = beside or {}
    offset = free_offset(avoid=int(beside["SPARKCTL_PORT_OFFSET"]) if "SPARKCTL_PORT_OFFSET" in beside else None)
    gateway = next(p for p in iter(free_port, None) if str(p) != beside.get("SPARKCTL_GATEWAY_PORT"))
    return {"SPARKCTL_INSTANCE": f"{prefix}-{uuid.uuid4().hex[:8]}", "SPARKCTL_PORT_OFFSET": str(offset),
            "SPARKCTL_GATEWAY_PORT": str(gateway)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_offset(*, avoid: int | None = None) -> int:
    """An offset that moves every port of the stack window onto free ports."""
    for offset in random.sample(OFFSETS, len(OFFSETS)):
        if offset != avoid and all(_free(port + offset) for port in STACK_PORTS):
            return offset
    raise RuntimeError(f"no free window of {len(STACK_PORTS)} ports between 10000 and 30000 on 127.0.0.1")


def remove(instance: str) -> int:
    """Remove every container of `instance` (and nothing else); how many there were."""
    found = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=sparkctl.instance={instance}"],
                           capture_output=True, text=True, check=False).stdout.split()
    if found:
        subprocess.run(["docker", "rm", "-f", *found], capture_output=True, check=False)
    return len(found)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
