"""An unchanged `up`, answered without the rest of the deploy pipeline.

After an `up` ends with its stack running, the pipeline keeps what that deployment was made from:
the settings' inputs (hashed), the stack, patch and image-policy files (name, inode, size, mtime),
the newest resolved digest, sparkctl's own code, and the fingerprint that came of them. The
pipeline's `up` first compares those with what they are now and asks Docker whether the stack's
one running container has that fingerprint. If all agree the rest of the pipeline would find
the same fingerprint running and do nothing, so the call records an unchanged deployment and stops
there: no image resolve, no weights or patches looked at. Like the pipeline it asks the registry
whether the pinned tag moved (an answer is reused for a minute: `Answers`), and says so. Anything
else, including `--refresh` and a registry that does not answer, runs the whole pipeline.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkctl import locate
from sparkctl.adapters.docker import DockerEngine
from sparkctl.deploy.progress import moved_note
from sparkctl.errors import SparkctlError
from sparkctl.phase import Phase
from sparkctl.state.store import Store

_CODE = Path(__file__).resolve().parents[1]  # the sparkctl package


@dataclass(frozen=True)
class Made:
    inputs: str  # locate.inputs(): the settings' environment, .env and working dir, hashed
    folders: list[str]  # where the stack's files are: stacks (with the image policy), patches
    files: list  # files(folders) then
    digests: float  # Digests.newest() then
    fingerprint: str
    parts: dict[str, str]
    spec_hash: str
    url: str
    warnings: list[str]  # the stack's opted-in risks, said again on every `up`
    watch: list[str] | None  # (where the registry is asked, the tag): did the pinned tag move?


def files(folders: list[str]) -> list:
    """Each file under `folders` and in sparkctl's code, as (path, inode, size, mtime)."""
    found = []
    for folder in (*folders, str(_CODE)):
        for root, dirs, names in os.walk(folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                st = os.stat(os.path.join(root, name))
                found.append((os.path.join(root, name), st.st_ino, st.st_size, st.st_mtime_ns))
    return found


def made(store: Store, *, stack: str, folders: list[Path], files_then: list, fingerprint: str,
         parts: dict[str, str], spec_hash: str, url: str, warnings: list[str], watch: tuple[str, str] | None) -> None:
    """Keep what a running deployment was made from; `files_then` was read before it began, so an
    edit during the deploy is seen as a change."""
    record = Made(locate.inputs(), [str(f) for f in folders], files_then, store.digests.newest(),
                  fingerprint, parts, spec_hash, url, warnings, list(watch) if watch else None)
    store.deployments.remember(stack, asdict(record))


def unchanged(store: Store, stack: str, docker: DockerEngine) -> tuple[Made, list[str]] | None:
    """The record of `stack`'s running deployment and the notes to show, if nothing it was made
    from changed and its container runs with its fingerprint; that `up` is then recorded. None:
    run the pipeline."""
    kept = store.deployments.made(stack)
    try:
        record = Made(**kept) if kept is not None else None
    except TypeError:  # kept by an older sparkctl
        return None
    if (record is None or record.inputs != locate.inputs() or record.digests != store.digests.newest()
            or _listed(record.files) != _listed(files(record.folders))):
        return None
    try:
        running = [c for c in docker.containers(stack) if c.running]
        if [(c.fingerprint, c.spec_hash) for c in running] != [(record.fingerprint, record.spec_hash)]:
            return None
        moved = store.answers.ask(record.watch[0], docker.registry_digest) if record.watch else None
    except SparkctlError:
        return None  # the pipeline asks again, and names what failed
    notes = [f"warning: {why}" for why in record.warnings]
    if record.watch and moved != record.parts["image"]:
        notes.append(moved_note(record.watch[1], record.parts["image"], moved))
    deployment = store.deployments.begin(stack)
    store.deployments.set_fingerprint(deployment, record.fingerprint, record.parts)
    store.deployments.advance(deployment, Phase.RUNNING, "unchanged")
    return record, notes


def _listed(found: list) -> list[tuple]:
    return [tuple(entry) for entry in found]  # JSON keeps tuples as lists
