"""A real registry on loopback (Debian's `docker-registry`) holding the sim image under the
real repository names, so sparkctl resolves, pins and pulls by digest as it would from ghcr.io.

Used by the tests (as a fixture) and the demo (`python -m tests.fakes.registry`). Talks to
Docker through its CLI, like a user would, since the sim package stays dependency-free.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

from tests.fakes.sandbox import free_port

# The sim image the tests publish; an engineer whose branch changes the sim builds it under a tag of
# their own (scripts/build-image.sh TAG src/sparkctl/sim/image --with-sim) and names it here, so
# two branches' sims never replace each other on a shared machine.
SIM_IMAGE = os.environ.get("SPARKCTL_TEST_SIM_IMAGE", "sparkctl-sim:latest")
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar"  # uncompressed: its digest is the diff id
SAVED = "sparkctl/saved"  # the repository every layer is uploaded to once, and mounted from
_LOOPBACK = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the registry is ours: no proxy
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
        self.port = port or free_port()
        self.host = f"127.0.0.1:{self.port}"
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
        )
        self._saved: dict[str, tuple[bytes, list[tuple[str, int]]]] = {}  # image -> its config, layers
        self.proc = subprocess.Popen(["docker-registry", "serve", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait()

    def push(self, image: str, repo_tag: str, *, env: dict[str, str] | None = None,
             labels: dict[str, str] | None = None) -> str:
        """Publish the local `image` as `<registry>/repo_tag`, with `env` and `labels` added to its
        config (as `ENV`/`LABEL` lines on top of it would); returns the manifest digest.

        Through the registry's API rather than `docker push`, which gzips every layer again for
        each registry it has not pushed to: ~30 CPU-s of dockerd for the sim's 330 MB, and every
        test session and benchmark starts a registry. Here the image is read once per registry
        (`docker save`), its layers go up as plain tars (a pull takes a tar as it takes a gzip),
        and a variant is only a new config: its layers are mounted from the repository that holds
        them."""
        if image not in self._saved:
            self._saved[image] = self._upload_saved(image)
        config, layers = self._saved[image]
        if env or labels:
            amended = json.loads(config)
            settings = amended.setdefault("config", {})
            settings["Env"] = (settings.get("Env") or []) + [f"{k}={v}" for k, v in (env or {}).items()]
            settings["Labels"] = {**(settings.get("Labels") or {}), **(labels or {})}
            config = json.dumps(amended).encode()
        repo, _, tag = repo_tag.rpartition(":")
        config_digest = self._put_blob(repo, config)
        for digest, _ in layers:
            self._place(repo, digest)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "size": len(config), "digest": config_digest},
            "layers": [{"mediaType": LAYER, "size": size, "digest": digest} for digest, size in layers],
        }).encode()
        self._request("PUT", f"/v2/{repo}/manifests/{tag}", manifest, {"Content-Type": MANIFEST})
        return "sha256:" + hashlib.sha256(manifest).hexdigest()

    def move_tag(self, repo_tag: str, image: str, *, stamp: str) -> str:
        """Point `repo_tag` at a rebuild of `image` that differs only by a label: a new digest."""
        return self.push(image, repo_tag, labels={"sparkctl.rebuild": stamp})

    def publish_sim(self, image: str = SIM_IMAGE) -> dict[str, str]:
        """Push the sim image under every real name the shipped stacks use; ref -> digest."""
        return {ref: self.push(image, ref, env={"SPARKCTL_SIM_PROFILE": profile} if profile else None)
                for ref, profile in PUBLISHED.items()}

    def _upload_saved(self, image: str) -> tuple[bytes, list[tuple[str, int]]]:
        """Stream `docker save image` into the registry's store (under repository `_saved`): every
        layer as a blob whose digest is its diff id. Returns the config's bytes and the layers'
        (digest, size), bottom first."""
        sizes: dict[str, int] = {}
        configs: dict[str, bytes] = {}
        saved = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with tarfile.open(fileobj=saved.stdout, mode="r|") as tar:
            for member in tar:
                if member.isfile() and member.name.startswith("blobs/sha256/"):
                    digest = "sha256:" + member.name.rpartition("/")[2]
                    sizes[digest] = member.size
                    if member.size < 1 << 20:  # the config (or an OCI index): kept, one is needed
                        configs[digest] = tar.extractfile(member).read()
                    else:
                        self._upload(SAVED, digest, tar.extractfile(member), member.size)
                elif member.name == "manifest.json":
                    [entry] = json.load(tar.extractfile(member))
        if saved.wait() != 0:
            raise RuntimeError(f"docker save {image}: {saved.stderr.read().decode().strip()}")
        layers = [(f"sha256:{path.rpartition('/')[2]}", 0) for path in entry["Layers"]]
        for digest, _ in layers:
            if digest in configs:  # a small layer
                self._upload(SAVED, digest, configs[digest], sizes[digest])
        return configs[f"sha256:{entry['Config'].rpartition('/')[2]}"], [(d, sizes[d]) for d, _ in layers]

    def _place(self, repo: str, digest: str) -> None:
        """Make a blob of this registry's store part of `repo` (a cross-repository mount)."""
        status, _ = self._request("POST", f"/v2/{repo}/blobs/uploads/?mount={digest}&from={SAVED}")
        if status != 201:
            raise RuntimeError(f"registry {self.host}: could not mount {digest} into {repo} (HTTP {status})")

    def _put_blob(self, repo: str, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self._upload(repo, digest, data, len(data))
        return digest

    def _upload(self, repo: str, digest: str, body, size: int) -> None:
        """Open an upload and send the blob in one PUT, which the registry checks against `digest`."""
        _, headers = self._request("POST", f"/v2/{repo}/blobs/uploads/")
        url = urllib.parse.urljoin(f"http://{self.host}/", headers["Location"])
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        self._request("PUT", url, body, {"Content-Type": "application/octet-stream", "Content-Length": str(size)})

    def _request(self, method: str, path: str, body=None, headers: dict[str, str] | None = None):
        """One call to the registry (`path`, or a URL it gave); its status and response headers."""
        url = path if path.startswith("http://") else f"http://{self.host}{path}"
        request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
        with _LOOPBACK.open(request, timeout=120) as response:
            return response.status, response.headers

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fakes.registry",
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
