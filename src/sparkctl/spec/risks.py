"""How the opt-in checks read what a stack file says: host paths and `vllm serve` flags as the
host and vLLM will take them, not as they are spelled.

A mount of `/var/run/./docker.sock`, `//var/run/docker.sock` or `/run` hands the engine the Docker
socket as surely as `/var/run/docker.sock` does, and vLLM reads `--trust_remote_code`,
`--trust-remote-code=True` and an abbreviation (argparse accepts any unambiguous prefix) as
`--trust-remote-code`. So paths are folded (`.`, `..`, repeated and leading slashes; `/var/run`
is a symlink to `/run` on Debian) and flags normalised (`_` is `-` in a flag's name, `=` splits
off its value) before `Stack.risks` and `Mount` judge them. Pure functions of strings; the
models call them. Spelling is all a stack file holds, so this is the early word (`stacks
validate`, with no host at hand); what a bind really reaches is judged where the engine runs,
on the path the host resolves (`deploy/binds.py`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
SOCKET_NAME = "docker.sock"  # rootless and snap engines keep theirs elsewhere, under this name
SYMLINKS = {("var", "run"): ("run",)}  # Debian's /var/run -> /run


def host_path(path: str, *, follow: bool = True) -> str:
    """`path` (absolute) folded as the host resolves it: `.` and empty parts dropped, `..` taken
    up a level (never above /); with `follow`, /var/run read as /run on the way."""
    parts: tuple[str, ...] = ()
    for part in path.split("/"):
        if part in ("", "."):
            continue
        parts = parts[:-1] if part == ".." else (*parts, part)
        if follow:
            parts = SYMLINKS.get(parts, parts)
    return "/" + "/".join(parts)


def is_root(path: str) -> bool:
    """Whether `path` names the filesystem's root however it is spelled (`/`, `//`, `/.`, `/var/..`)."""
    return path.startswith("/") and host_path(path) == "/"


def reaches_docker_socket(source: str) -> bool:
    """Whether a bind mount of `source` gives the container the Docker socket: the socket itself
    or a directory that holds it, read with and without the /var/run symlink."""
    if not source.startswith("/"):  # a named volume, not a host path
        return False
    for folded in {host_path(source), host_path(source, follow=False)}:
        if folded.rsplit("/", 1)[-1] == SOCKET_NAME:
            return True
        if any(socket == folded or socket.startswith(folded.rstrip("/") + "/") for socket in DOCKER_SOCKETS):
            return True
    return False


def flag_values(args: Sequence[str], flag: str) -> list[str | None]:
    """The values `args` give `flag` (e.g. `--host`), once per time they set it, as vLLM's parser
    reads them: any `_`/`-` spelling, any prefix of the name, `--flag=value` or `--flag value`.
    None for a flag given without a value (a switch, or the last argument). A prefix another flag
    shares is ambiguous to argparse and fails the engine's start: counting it costs nothing."""
    found: list[str | None] = []
    for i, arg in enumerate(args):
        name, has_value, value = flag_name(arg).partition("=")
        if not arg.startswith("--") or len(name) <= 2 or not flag.startswith(name):
            continue
        found.append(value if has_value else args[i + 1] if i + 1 < len(args) else None)
    return found


def flag_name(arg: str) -> str:
    """`arg` with `_` read as `-` in the flag's name (up to a `=` or a JSON key's `.`), as vLLM's
    FlexibleArgumentParser does; anything not starting with `--` is returned as it is."""
    if not arg.startswith("--"):
        return arg
    key, eq, value = arg[2:].partition("=")
    head, dot, rest = key.partition(".")
    return "--" + head.replace("_", "-") + dot + rest + eq + value


def is_loopback(host: str) -> bool:
    """Whether an engine listening on `host` is reachable from this machine only."""
    host = host.strip().removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name or something vLLM will resolve: not known to be loopback
        return False
