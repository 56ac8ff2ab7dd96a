"""The image step: resolve the stack's tag to a digest, refuse what the policy refuses, report a
tag that moved since it was pinned, and pull by digest with per-layer progress.

A pin of the image policy (known-good) or the digest recorded by an earlier `up` decides what runs;
the registry's current answer is only followed with `refresh`. With a digest already known, the
registry is asked in the background whether the tag moved (a round trip to ghcr.io is hundreds
of ms), unless it was in the last minute (`Answers`): the deploy goes on, and the answer is a
note before it ends. Called by the pipeline.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparkctl.adapters import registry
from sparkctl.adapters.docker import DockerEngine
from sparkctl.deploy.progress import Reporter, moved_note
from sparkctl.deploy.weights import HEADROOM, existing
from sparkctl.errors import SparkctlError
from sparkctl.policy.images import ImageName, ImagePolicy, check, mirrored
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store

# A pull keeps each layer as downloaded and as extracted; extracted layers of a Python and CUDA
# image take about as much again as their compressed size, so a pull needs about twice that.
PULL_FACTOR = 2


@dataclass(frozen=True)
class ResolvedImage:
    name: ImageName  # the image's real identity (policy, pins and records use it)
    digest: str
    run_ref: str  # what Docker runs: the fetch location with the digest
    source: str | None = None  # where the registry is asked what the tag names (None: a local build)
    watch: threading.Thread | None = None  # asks the registry whether the pinned tag moved

    def settle(self) -> None:
        """Wait for the moved-tag check (its note is reported before the deploy's outcome)."""
        if self.watch is not None:
            self.watch.join()


def resolve(stack: Stack, *, policy: ImagePolicy, docker: DockerEngine, store: Store,
            mirrors: Mapping[str, str], refresh: bool, reporter: Reporter) -> ResolvedImage:
    name = check(policy, stack.image.ref, allow_latest=stack.image.allow_latest)
    source = mirrored(ImageName(name.registry, name.path, name.tag), mirrors)
    pin = policy.pin_for(name.tagged)
    known = stack.image.digest or (pin.digest if pin else None) or store.digests.get(name.tagged)
    local = docker.local_image_id(stack.image.ref, built_here=True)
    if local and not refresh and known in (None, local):  # built here, never pushed: run that build
        reporter.note(stack.name, f"{stack.image.ref} is a local build ({local[:19]}), not from a registry")
        check(policy, stack.image.ref, digest=local, allow_latest=stack.image.allow_latest)
        return ResolvedImage(name, local, local)
    repository = source.rsplit(":", 1)[0] if name.tag else source
    if known is not None and not refresh:
        check(policy, stack.image.ref, digest=known, allow_latest=stack.image.allow_latest)
        watch = threading.Thread(target=_watch_tag, args=(docker, store, source, stack, name, known, reporter),
                                 daemon=True)
        watch.start()
        return ResolvedImage(name, known, f"{repository}@{known}", source, watch)
    digest = _remote_digest(docker, source, stack, reporter, required=True)
    assert digest is not None
    store.answers.record(source, digest)
    check(policy, stack.image.ref, digest=digest, allow_latest=stack.image.allow_latest)
    return ResolvedImage(name, digest, f"{repository}@{digest}", source)


def _watch_tag(docker: DockerEngine, store: Store, source: str, stack: Stack, name: ImageName, known: str,
               reporter: Reporter) -> None:
    moved = store.answers.ask(source, lambda ref: _remote_digest(docker, ref, stack, reporter, required=False))
    if moved and moved != known:
        reporter.note(stack.name, moved_note(name.tagged, known, moved))


def pull(image: ResolvedImage, *, stack: str, docker: DockerEngine, reporter: Reporter) -> None:
    """Pull by digest unless Docker has it already (progress reported as `stack`'s), once the
    engine's disk has room for it."""
    if docker.local_image_id(image.run_ref):
        return
    room_for(image.run_ref, stack=stack, docker=docker, reporter=reporter)
    repository = image.run_ref.split("@", 1)[0]
    docker.pull(repository, image.digest,
                on_layer=lambda layer, done, total: reporter.progress(stack, f"layer {layer}", done, total))


def room_for(ref: str, *, stack: str, docker: DockerEngine, reporter: Reporter) -> None:
    """Refuse a pull the engine's disk cannot hold: the layers' compressed size in the registry's
    manifest, PULL_FACTOR times over, plus HEADROOM, against the free space of Docker's root dir
    (when the engine is on this machine). A registry that does not say is a note, not a refusal."""
    root = Path(docker.facts().root_dir)
    if not root.is_dir():
        return  # a remote engine's disk: not ours to read
    try:
        size = registry.image_bytes(ref)
    except SparkctlError as e:
        reporter.note(stack, f"the image's size is unknown ({e}); pulling without a disk check")
        return
    free = shutil.disk_usage(existing(root)).free
    if size * PULL_FACTOR + HEADROOM > free:
        raise SparkctlError(f"not enough disk for image {ref}: {size / 1e9:.1f} GB compressed, about "
                            f"{size * PULL_FACTOR / 1e9:.1f} GB once extracted (+{HEADROOM / 1e9:.1f} GB headroom), "
                            f"{free / 1e9:.1f} GB free at {root}; free space (`docker image prune`) or move "
                            "Docker's data-root to a larger disk")


def _remote_digest(docker: DockerEngine, source: str, stack: Stack, reporter: Reporter, *,
                   required: bool) -> str | None:
    try:
        return docker.registry_digest(source)
    except SparkctlError as e:
        if required:
            raise SparkctlError(f"cannot resolve {stack.image.ref} to a digest: {e}") from None
        reporter.note(stack.name, f"registry unreachable ({e}); using the recorded digest")
        return None
