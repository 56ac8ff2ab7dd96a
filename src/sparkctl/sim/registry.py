"""A real registry on loopback (Debian's `docker-registry`) holding the sim image under the
real repository names, so sparkctl resolves, pins and pulls by digest as it would from ghcr.io.

Used by the tests (as a fixture) and the demo (`python -m sparkctl.sim.registry`). Talks to
Docker through its CLI, like a user would, since the sim package stays dependency-free.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

SIM_IMAGE = "sparkctl-sim:latest"
# repository:tag -> the sim profile baked into that image (None: chosen from the stack's model)
PUBLISHED = {
    "aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix": None,
    "aeon-7/vllm-aeon-ultimate-dflash:qwen36-v4": None,
    "aeon-7/aeon-gemma-4-26b-a4b-dflash:v2": None,
    "aeon-7/aeon-gemma-4-26b-a4b-dflash:latest": "aeon-gemma4-latest-broken",
    "vllm/vllm-openai:v0.24.0": None,
    "vllm/vllm-openai:gemma": None,
    "eugr/spark-vllm:latest": None,
}


class Registry:
    """`docker-registry serve` on 127.0.0.1:<port> with its own data dir."""

    def __init__(self, root: Path, *, port: int = 0) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.port = port or _free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
        )
        self.proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait()

    def push(self, image: str, repo_tag: str) -> str:
        """Push a local image as `<registry>/repo_tag`; returns the manifest digest."""
        target = f"{self.host}/{repo_tag}"
        _docker("tag", image, target)
        out = _docker("push", target)
        _docker("rmi", target)
        return re.search(r"digest: (sha256:[0-9a-f]{64})", out).group(1)

    def move_tag(self, repo_tag: str, image: str, *, stamp: str) -> str:
        """Point `repo_tag` at a rebuild of `image` that differs only by a label: a new digest."""
        return self.push(derive(image, labels={"sparkctl.rebuild": stamp}), repo_tag)

    def publish_sim(self, image: str = SIM_IMAGE) -> dict[str, str]:
        """Push the sim image under every real name the shipped stacks use; ref -> digest."""
        return {ref: self.push(derive(image, env={"SPARKCTL_SIM_PROFILE": profile}) if profile else image, ref)
                for ref, profile in PUBLISHED.items()}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def _wait(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"docker-registry exited: {self.proc.stderr.read().decode()}") from None
                time.sleep(0.1)
        raise RuntimeError("docker-registry did not answer within 20 s")


def derive(image: str, *, env: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> str:
    """A local image FROM `image` with extra env/labels (no layers added); returns its tag."""
    lines = [f"FROM {image}"]
    lines += [f"ENV {k}={v}" for k, v in (env or {}).items()]
    lines += [f'LABEL {k}="{v}"' for k, v in (labels or {}).items()]
    dockerfile = "\n".join(lines) + "\n"
    tag = "sparkctl-sim-derived:" + hashlib.sha256(dockerfile.encode()).hexdigest()[:12]
    subprocess.run(["docker", "build", "-q", "-t", tag, "-"], input=dockerfile, text=True, check=True,
                   capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    return tag


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkctl.sim.registry",
                                     description="Run a loopback registry holding the sim image under real names.")
    parser.add_argument("--root", type=Path, required=True, help="data dir for the registry")
    parser.add_argument("--port", type=int, default=5001)
    args = parser.parse_args(argv)
    registry = Registry(args.root, port=args.port)
    for ref, digest in registry.publish_sim().items():
        print(f"{registry.host}/{ref} {digest}", flush=True)
    print(f"registry on {registry.host}; set SPARKCTL_REGISTRY_MIRRORS=ghcr.io={registry.host},"
          f"docker.io={registry.host}. Ctrl-C stops it.", flush=True)
    try:
        registry.proc.wait()
    except KeyboardInterrupt:
        registry.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
