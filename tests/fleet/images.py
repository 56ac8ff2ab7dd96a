"""Getting images onto the fleet tests' hosts: a registry the hosts reach through the bridge, and
`docker save | docker load` for the big local images.

Used by tests/fleet/hosts.py and the fleet tests. The registry is Debian's `docker-registry`
twice over one storage dir: the root dockerd pushes to 127.0.0.1:P (loopback is trusted), and the
hosts pull from <bridge address>:Q, which their dockerd lists under --insecure-registry (their
127.0.0.1 is their own). Measured here for the 331 MB sim image: push 9.9 s once, then 4.3 s per
host to pull; `docker save` 2.0 s once, then 3.1 s per host to load. Loading wins for a few hosts,
so `load` moves local images and the registry serves what must come by digest.

The 3.9 GB vLLM CPU image takes ~110 s to load into each host, so its layers, once loaded, are
kept as a seed: a data root holding that image alone, in the build cache. A host whose dockerd
has not started yet gets the seed's layers as hard links (seconds) and finds the image there.
Image layers are never written in place (overlay2 keeps them as read-only lower dirs; dockerd
rewrites its metadata by rename), so the links share nothing that changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from tests.fakes.registry import Registry
from tests.teardown import stop

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
        stop(self.bridge_proc, 10)
        stop(self.proc, 10)

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


def image_id(image: str) -> str:
    """The root engine's id of a local image, without its "sha256:"."""
    return subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], check=True, capture_output=True,
                          text=True).stdout.strip().removeprefix("sha256:")


def keep(host: Host, image: str, seed: Path) -> None:
    """Copy `image` as `host`'s dockerd holds it (overlay2) into `seed`: its config, each layer's
    record and, as hard links, its files; the tag in a repositories.json of its own. Written
    aside and renamed, so a seed is whole or absent."""
    root, ident = host.root / "docker", image_id(image)
    store, partial = root / "image" / "overlay2", seed.with_name(f"{seed.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "overlay2" / "l").mkdir(parents=True)
    config = store / "imagedb" / "content" / "sha256" / ident
    _copy(config, partial / config.relative_to(root))
    for chain in _chain_ids(json.loads(config.read_text())["rootfs"]["diff_ids"]):
        layer = store / "layerdb" / "sha256" / chain
        _copy(layer, partial / layer.relative_to(root))
        cache_id = (layer / "cache-id").read_text().strip()
        _copy(root / "overlay2" / cache_id, partial / "overlay2" / cache_id, link=True)
        short = (root / "overlay2" / cache_id / "link").read_text().strip()
        (partial / "overlay2" / "l" / short).symlink_to(f"../{cache_id}/diff")
    repository = image.rpartition(":")[0]
    (partial / "image" / "overlay2" / "repositories.json").write_text(
        json.dumps({"Repositories": {repository: {image: f"sha256:{ident}"}}}))
    shutil.rmtree(seed, ignore_errors=True)
    try:
        partial.rename(seed)
    except OSError:  # another run (a tier beside this one) made it meanwhile
        shutil.rmtree(partial, ignore_errors=True)


def seed_root(root: Path, seed: Path) -> None:
    """A data root for a dockerd that has not started, holding the seed's image: layer files as
    hard links, the (small) metadata as copies that dockerd may rewrite."""
    root.mkdir(parents=True, exist_ok=True)
    _copy(seed / "overlay2", root / "overlay2", link=True)
    _copy(seed / "image", root / "image")


def _chain_ids(diff_ids: list[str]) -> list[str]:
    """Each layer's chain id (OCI image spec): the first diff id, then sha256("<parent> <diff>")."""
    chains: list[str] = []
    for diff in diff_ids:
        chains.append(diff if not chains else "sha256:" + hashlib.sha256(f"{chains[-1]} {diff}".encode()).hexdigest())
    return [c.removeprefix("sha256:") for c in chains]


def _copy(source: Path, dest: Path, *, link: bool = False) -> None:
    """`cp -a`: owners, modes and the overlay xattrs (opaque dirs) kept; files hard-linked with `link`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", *(["--link"] if link else []), "-T", str(source), str(dest)], check=True,
                   capture_output=True)


def _free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]
