"""The bind check: every host path sparkctl hands Docker, judged as the host will resolve it.

A stack names host folders in `model.path`, `draft.path` and `container.mounts`; sparkctl adds
the HF cache's repo folders, the patch overlays and the compile cache. However a path is spelled
(`/proc/self/root/run`, a symlink, `/var/run/..`), the kernel mounts what it resolves to, so each
source is resolved here (`os.path.realpath`, on the host whose Docker runs the engine) and the
container is given that resolved path: what was judged is what is mounted. Refused, whatever
`allow:` says: the host's root and its system folders (`DENIED`, or a folder holding one) and any
folder holding a socket (the Docker socket is root on the host); the one exception is the Docker
socket itself under `allow: [docker-socket]`. Outside the folders sparkctl owns (the HF cache, the
instance's overlays, the stack's compile cache) a path needs `allow: [host-path]`.

`Deployer._check` judges the stack's own paths before anything is fetched; `Launch.create` judges
every mount of the rendered container before it is created.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path

from sparkctl.errors import SparkctlError
from sparkctl.spec.render import MountPlan
from sparkctl.spec.risks import DOCKER_SOCKETS, SOCKET_NAME, host_path

# Never mounted: the kernel's and the engine's views of the host, its configuration, the
# Docker and containerd state (every container's files), the runtime sockets.
DENIED = ("/proc", "/sys", "/dev", "/run", "/var/run", "/etc", "/boot", "/var/lib/docker", "/var/lib/containerd")
MAX_ENTRIES = 200_000  # a folder with more is not searched for sockets: mount a narrower one


class BindError(SparkctlError):
    """A bind sparkctl will not hand Docker: nothing was created."""


def checked(mounts: Sequence[MountPlan], *, owned: Sequence[Path | str], allow: Collection[str]
            ) -> tuple[MountPlan, ...]:
    """`mounts` with each source resolved on this host, or a BindError for the first refused."""
    return tuple(replace(m, source=judge(m.source, where=f"the mount at {m.target}", owned=owned, allow=allow))
                 for m in mounts)


def judge(source: str, *, where: str, owned: Sequence[Path | str], allow: Collection[str]) -> str:
    """The host path a bind of `source` mounts, resolved; a BindError naming `where` (the stack's
    field) when sparkctl will not mount it, with what to do instead."""
    if not source.startswith("/"):
        raise BindError(f"{where}: {source!r} is not an absolute host path; name the folder as /...")
    try:
        real = os.path.realpath(source, strict=True)
    except OSError as e:  # missing, or not resolvable by this process (another's /proc/<pid>/root)
        _refuse_system(source, host_path(source), where)  # as spelled, then: a system folder says so
        if isinstance(e, FileNotFoundError):
            raise BindError(f"{where}: {source} does not exist on this host; create it or fix the path") from None
        raise BindError(f"{where}: {source} cannot be resolved on this host ({e.strerror}); name the folder by "
                        "its own path") from None
    seen = f"{source}" if real == source else f"{source} (on this host: {real})"
    if "docker-socket" in allow and _docker_socket(real):
        return real  # the stack's own opt-in: the engine gets root on the host
    _refuse_system(seen, real, where)
    roots = [os.path.realpath(r) for r in owned]
    if not any(_inside(real, r) for r in roots) and "host-path" not in allow:
        raise BindError(f"{where}: {seen} is outside the folders sparkctl owns ({', '.join(roots)}); add "
                        "`allow: [host-path]` to the stack if the engine should read it")
    socket = _socket_in(real, where)
    if socket is not None:
        raise BindError(f"{where}: {seen} holds a socket ({socket}): a process in the engine could talk to whatever "
                        "listens on it (the Docker socket is root on the host); mount a folder without one")
    return real


def _refuse_system(seen: str, path: str, where: str) -> None:
    system = next((d for d in sorted(_denied()) if _inside(path, d) or _inside(d, path)), None)
    if system is not None:
        raise BindError(f"{where}: {seen} is or holds the host's {system}, which sparkctl never mounts into an engine "
                        "(whatever `allow:` says); mount a folder of its own instead")


def _denied() -> set[str]:
    """`DENIED`, as spelled and as resolved here (/var/run is a link to /run on Debian)."""
    return {*DENIED, *map(os.path.realpath, DENIED)}


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _docker_socket(real: str) -> bool:
    return stat.S_ISSOCK(os.stat(real).st_mode) and (real in DOCKER_SOCKETS or os.path.basename(real) == SOCKET_NAME)


def _socket_in(real: str, where: str) -> str | None:
    """The first socket in the tree at `real` (itself, if a file), its links not followed: a link
    inside the mount resolves in the container, not on the host."""
    mode = os.stat(real).st_mode
    if not stat.S_ISDIR(mode):  # a file overlaid on one of the image's
        return real if stat.S_ISSOCK(mode) else None
    folders, seen = [real], 0
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        raise BindError(f"{where}: {real} has more than {MAX_ENTRIES:,} entries to search for "
                                        "sockets; mount a narrower folder")
                    mode = entry.stat(follow_symlinks=False).st_mode
                    if stat.S_ISSOCK(mode):
                        return entry.path
                    if stat.S_ISDIR(mode):
                        folders.append(entry.path)
        except OSError as e:  # unreadable, or changed while it was searched
            raise BindError(f"{where}: cannot look inside {e.filename} for sockets ({e.strerror}); mount a folder "
                            "sparkctl can read") from None
    return None
