"""The image step: resolve the stack's tag to a digest, refuse what the policy refuses, report a
tag that moved since it was pinned, and pull by digest with per-layer progress.

A pin in images.yaml (known-good) or the digest recorded by an earlier `up` decides what runs;
the registry's current answer is only followed with `refresh`. Called by the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sparkctl.adapters.docker import DockerEngine
from sparkctl.deploy.progress import Reporter
from sparkctl.errors import SparkctlError
from sparkctl.policy.images import ImageName, ImagePolicy, check, mirrored
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store


@dataclass(frozen=True)
class ResolvedImage:
    name: ImageName  # the image's real identity (policy, pins and records use it)
    digest: str
    run_ref: str  # what Docker runs: the fetch location with the digest
    moved_to: str | None = None  # the registry's newer digest, when the tag moved and was not followed


def resolve(stack: Stack, *, policy: ImagePolicy, docker: DockerEngine, store: Store,
            mirrors: Mapping[str, str], refresh: bool, reporter: Reporter) -> ResolvedImage:
    name = check(policy, stack.image.ref, allow_latest=stack.image.allow_latest)
    source = mirrored(ImageName(name.registry, name.path, name.tag), mirrors)
    known = stack.image.digest or _pinned(policy, name) or store.digests.get(name.tagged)
    local = docker.local_image_id(stack.image.ref, built_here=True)
    if local and not refresh and known in (None, local):  # built here, never pushed: run that build
        reporter.note(stack.name, f"{stack.image.ref} is a local build ({local[:19]}), not from a registry")
        check(policy, stack.image.ref, digest=local, allow_latest=stack.image.allow_latest)
        return ResolvedImage(name, local, local)
    remote = _remote_digest(docker, source, stack, reporter, required=refresh or known is None)
    digest = remote if (refresh or known is None) else known
    moved = remote if remote and known and remote != known and not refresh else None
    if moved:
        reporter.note(stack.name, f"tag {name.tagged} has moved: pinned {known[:19]}, registry now {moved[:19]}; "
                                  "running the pinned digest (`sparkctl up --refresh` follows the tag)")
    check(policy, stack.image.ref, digest=digest, allow_latest=stack.image.allow_latest)
    repository = source.rsplit(":", 1)[0] if name.tag else source
    return ResolvedImage(name, digest, f"{repository}@{digest}", moved)


def pull(image: ResolvedImage, *, stack: str, docker: DockerEngine, reporter: Reporter) -> None:
    """Pull by digest unless Docker has it already (progress reported as `stack`'s)."""
    if docker.local_image_id(image.run_ref):
        return
    repository = image.run_ref.split("@", 1)[0]
    docker.pull(repository, image.digest,
                on_layer=lambda layer, done, total: reporter.progress(stack, f"layer {layer}", done, total))


def _pinned(policy: ImagePolicy, name: ImageName) -> str | None:
    pin = policy.pin_for(name.tagged)
    return pin.digest if pin else None


def _remote_digest(docker: DockerEngine, source: str, stack: Stack, reporter: Reporter, *,
                   required: bool) -> str | None:
    try:
        return docker.registry_digest(source)
    except SparkctlError as e:
        if required:
            raise SparkctlError(f"cannot resolve {stack.image.ref} to a digest: {e}") from None
        reporter.note(stack.name, f"registry unreachable ({e}); using the recorded digest")
        return None
