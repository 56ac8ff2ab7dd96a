"""An unchanged `up`, answered without the rest of the deploy pipeline.

After an `up` ends with its stack running, the pipeline keeps what that deployment was made from:
the settings' inputs (hashed), the stack, patch and image-policy files (name, inode, size, mtime),
the newest resolved digest, sparkctl's own code, and the fingerprint and container that came of
them. The next `up` of the stack compares those with what they are now and asks Docker, over its
socket, whether that container still runs with that fingerprint. If all agree the pipeline would
find the same fingerprint running and do nothing, so the call records an unchanged deployment and
stops there. The CLI asks before it loads anything else (no settings' models, Docker SDK or Hub
client: docs/perf.md), and the pipeline asks first in its `up`, so a daemon answers a repeated
`up` the same way. Like the pipeline it asks the registry whether the pinned tag moved (an answer
is reused for a minute: `Answers`), and says so. Anything else, including `--refresh` and a
registry that does not answer, runs the pipeline.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from sparkctl import locate
from sparkctl.adapters import dockersock
from sparkctl.container import LABEL_FINGERPRINT, LABEL_SPEC_HASH
from sparkctl.deploy.progress import moved_note
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
    container: str
    socket: str  # Docker's
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
         parts: dict[str, str], spec_hash: str, container: str, docker_host: str | None, url: str,
         warnings: list[str], watch: tuple[str, str] | None, environ: Mapping[str, str] = os.environ) -> None:
    """Keep what a running deployment was made from; `files_then` was read before it began, so an
    edit during the deploy is seen as a change. Nothing is kept for an engine Docker serves over
    TCP or SSH: only a socket is asked without the SDK."""
    socket = dockersock.socket_of(docker_host, environ)
    if socket is None:
        return
    record = Made(locate.inputs(environ), [str(f) for f in folders], files_then, store.digests.newest(),
                  fingerprint, parts, spec_hash, container, str(socket), url, warnings, list(watch) if watch else None)
    store.deployments.remember(stack, asdict(record))


def unchanged(store: Store, stack: str, environ: Mapping[str, str] = os.environ) -> tuple[Made, list[str]] | None:
    """The record of `stack`'s running deployment and the notes to show, if nothing it was made
    from changed and its container runs with its fingerprint; that `up` is then recorded. None:
    run the pipeline."""
    kept = store.deployments.made(stack)
    if kept is None:
        return None
    record = Made(**kept)
    if (record.inputs != locate.inputs(environ) or record.digests != store.digests.newest()
            or _listed(record.files) != _listed(files(record.folders))):
        return None
    socket = Path(record.socket)
    try:
        labels = dockersock.running_labels(socket, record.container)
        if not labels or labels.get(LABEL_FINGERPRINT) != record.fingerprint \
                or labels.get(LABEL_SPEC_HASH) != record.spec_hash:
            return None
        asker = partial(dockersock.registry_digest, socket)
        moved = store.answers.ask(record.watch[0], asker) if record.watch else None
    except OSError:
        return None  # the pipeline says what is wrong with Docker
    if record.watch and moved is None:
        return None  # the pipeline asks with the SDK's credentials, and names what failed
    notes = [f"warning: {why}" for why in record.warnings]
    if record.watch and moved != record.parts["image"]:
        notes.append(moved_note(record.watch[1], record.parts["image"], moved))
    deployment = store.deployments.begin(stack)
    store.deployments.set_fingerprint(deployment, record.fingerprint, record.parts)
    store.deployments.advance(deployment, Phase.RUNNING, "unchanged")
    return record, notes


def _listed(found: list) -> list[tuple]:
    return [tuple(entry) for entry in found]  # JSON keeps tuples as lists
