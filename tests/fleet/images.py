"""Getting images onto the fleet tests' hosts: a registry the hosts reach through the bridge, and
`docker save | docker load` for the big local images.

Used by tests/fleet/hosts.py and the fleet tests. The registry is Debian's `docker-registry`
twice over one storage dir: the root dockerd pushes to 127.0.0.1:P (loopback is trusted), and the
hosts pull from <bridge address>:Q, which their dockerd lists under --insecure-registry (their
127.0.0.1 is their own). Measured here for the 331 MB sim image: push 9.9 s once, then 4.3 s per
host to pull; `docker save` 2.0 s once, then 3.1 s per host to load. Loading wins for a few hosts,
so `load` moves local images and the registry serves what must come by digest.
"""

from __future__ import annotations

import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from sparkctl.sim.registry import Registry

if TYPE_CHECKING:
    from tests.fleet.hosts import Host


class BridgeRegistry(Registry):
    """A loopback registry (`.host`, for pushes from the root side) whose content the hosts pull
    from `.bridge_host`."""

    def __init__(self, root: Path, *, bridge: str) -> None:
        super().__init__(root)
        self.bridge_host = f"{bridge}:{_free_port(bridge)}"
        config = root / "bridge.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.bridge_host}\n"
        )
        self.bridge_proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_on(self.bridge_host, self.bridge_proc)

    def stop(self) -> None:
        self.bridge_proc.terminate()
        self.bridge_proc.wait(timeout=10)
        super().stop()

    def _wait_on(self, host: str, proc: subprocess.Popen) -> None:
        address, port = host.rsplit(":", 1)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((address, int(port)), timeout=1).close()
                return
            except OSError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    why = proc.stderr.read().decode() if proc.poll() is not None else "no answer within 20 s"
                    raise RuntimeError(f"docker-registry on {host} did not start: {why}") from e
                time.sleep(0.02)


def load(hosts: list[Host], image: str, *, cache: Path) -> dict[str, float]:
    """`docker save` a local image once (into `cache`, named by its id: a rebuilt image is saved
    again and its old tarball removed), `docker load` it into every host at once; the seconds each
    host took (the save is counted under "save")."""
    started = time.monotonic()
    name = image.replace("/", "_").replace(":", "_")
    image_id = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], check=True, capture_output=True,
                              text=True).stdout.strip().removeprefix("sha256:")[:16]
    tar = cache / f"{name}-{image_id}.tar"
    if not tar.exists():
        cache.mkdir(parents=True, exist_ok=True)
        for old in cache.glob(f"{name}-*.tar"):
            old.unlink()
        subprocess.run(["docker", "save", "-o", str(tar), image], check=True, capture_output=True)
    seconds = {"save": time.monotonic() - started}

    def one(host: Host) -> float:
        began = time.monotonic()
        host.docker("load", "-q", "-i", str(tar))
        return time.monotonic() - began

    with ThreadPoolExecutor(len(hosts)) as pool:
        seconds.update(zip((h.name for h in hosts), pool.map(one, hosts), strict=True))
    return seconds


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]
