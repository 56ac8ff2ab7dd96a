"""The fleet tests' wire: one Linux bridge in the root namespace and one network namespace per
"host", joined to it by a veth pair, all named after a per-run tag so that parallel runs and an
owner's own namespaces are never touched. A tag begins with the test run's id (tests.teardown),
so the end of a pytest session finds and sweeps whatever any of its tests or benchmarks left.

Used by tests/fleet/hosts.py. Plain L2 on a private /24 that no existing route covers: the bridge
holds .1 (so the root namespace reaches the hosts), each host one address on its `cx7` end (named
after the ConnectX-7 link it stands for). No forwarding, no iptables, no default route inside the
namespaces: nothing a host sends can leave the bridge.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import random
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tests.teardown import run_id

NETNS_DIR = Path("/var/run/netns")
TAG_PREFIX = "spk"  # every object is named spk<run id><4 hex>...; sweep() matches that exact tag only
LINK = "cx7"  # the host's end of its veth, inside its namespace


class HarnessError(RuntimeError):
    """The machine could not give the fleet tests what they need (says what to do about it)."""


class Network:
    """The bridge, its /24 and the namespaces on it; `add(name)` plugs in one more host."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.bridge = f"{tag}br"
        self.hosts: dict[str, str] = {}  # namespace -> address
        _ip("link", "add", self.bridge, "type", "bridge", what="create the fleet tests' bridge")
        _no_ipv6(self.bridge)
        with open(Path(tempfile.gettempdir()) / "sparkctl-fleet-subnets.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # runs side by side (scripts/tiers.sh -j) pick one at a time
            self.subnet = free_subnet()
            self.gateway = str(self.subnet.network_address + 1)
            _ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, name: str) -> tuple[str, str]:
        """Create namespace `<tag>-<name>` wired to the bridge; returns (namespace, address)."""
        netns, veth = f"{self.tag}-{name}", f"{self.tag}{name}"
        address = str(self.subnet.network_address + 2 + len(self.hosts))
        _ip("netns", "add", netns, what="create a network namespace")
        self.hosts[netns] = address
        _ip("link", "add", veth, "type", "veth", "peer", "name", LINK, "netns", netns)
        _no_ipv6(veth)
        _ip("link", "set", veth, "master", self.bridge, "up")
        inside = ("-n", netns)
        _ip(*inside, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", LINK)
        _ip(*inside, "link", "set", LINK, "up")
        _ip(*inside, "link", "set", "lo", "up")
        return netns, address

    def set_link(self, name: str, *, up: bool) -> None:
        """Unplug (or plug back) a host's cable: its address stops answering, as a dead Spark's."""
        _ip("link", "set", f"{self.tag}{name}", "up" if up else "down")


def run_tag() -> str:
    """A fresh tag in this run: TAG_PREFIX, the run's id, 4 hex of its own (11 characters: a link
    named after it, plus a host's letter or `br`, stays within Linux's 15)."""
    return f"{run_prefix()}{uuid.uuid4().hex[:4]}"


def run_prefix() -> str:
    """What every tag of this run begins with."""
    return f"{TAG_PREFIX}{run_id()}"


def pids(netns: str) -> list[int]:
    """Every process whose network namespace is `netns` (containers with --network host too)."""
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=False)
    return [int(p) for p in done.stdout.split()]


def namespaces(tag: str) -> list[str]:
    """This run's namespaces (and only this run's)."""
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{tag}-"))


def links(tag: str) -> list[str]:
    """This run's links in the root namespace: the bridge and the veths' root ends."""
    shown = json.loads(_ip("-j", "link", "show") or "[]")
    return sorted(link["ifname"] for link in shown if link["ifname"].startswith(tag))


def remove(tag: str) -> None:
    """Delete this run's namespaces and links (their processes must be gone first)."""
    for netns in namespaces(tag):
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
    for link in links(tag):  # deleting a namespace takes its veth pair with it; the bridge stays
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)


def free_subnet() -> ipaddress.IPv4Network:
    """A 10.213.X.0/24 that no address or route of the root namespace overlaps (another run's
    bridge included)."""
    taken = [ipaddress.ip_network(r["dst"], strict=False) for r in json.loads(_ip("-j", "-4", "route", "show",
                                                                                    "table", "all") or "[]")
             if r.get("dst", "default") not in ("default",) and _is_v4(r["dst"])]
    for third in random.sample(range(1, 255), 254):
        candidate = ipaddress.ip_network(f"10.213.{third}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise HarnessError("every 10.213.X.0/24 is already routed here: remove stale fleet-test bridges "
                       "(`ip -br link | grep ^spk`) and retry")


def wait_gone(netns: str, *, timeout: float = 10) -> None:
    """Kill every process of `netns` until none is left (a dying dockerd may still fork)."""
    deadline = time.monotonic() + timeout
    while found := pids(netns):
        for pid in found:
            _kill(pid)
        if time.monotonic() > deadline:
            raise HarnessError(f"processes {found} of namespace {netns} survived SIGKILL for {timeout} s")
        time.sleep(0.02)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass


def _is_v4(dst: str) -> bool:
    try:
        return ipaddress.ip_network(dst, strict=False).version == 4
    except ValueError:
        return False


def _no_ipv6(link: str) -> None:
    """No IPv6 link-local chatter on the test's links (the bridge is isolated anyway)."""
    knob = Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6")
    if knob.exists():
        knob.write_text("1")


def _ip(*args: str, what: str = "") -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HarnessError(f"`ip {' '.join(args)}` failed ({what or 'fleet test wiring'}): {done.stderr.strip()}. "
                           "The fleet tests need root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2; "
                           "CI runs them as root (`make test`).")
    return done.stdout
