"""The error tree every layer raises from, and the CLI's one boundary catches.

Permanent errors need the user to change something; transient ones may pass on retry and
carry a delay. Adapters translate third-party exceptions into these (`raise ... from e`).
"""

from __future__ import annotations


class SparkctlError(Exception):
    """Something sparkctl attempted failed; the message says what, why and what to do."""

    transient = False


class TransientError(SparkctlError):
    """May succeed if retried after `delay` seconds (a registry hiccup, a busy engine)."""

    transient = True

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class Unreachable(TransientError):
    """A server sparkctl fetches from (a registry, the Hub) could not be reached: `problem` says
    how ("does not resolve": the Spark is offline, or its DNS is), `setting` points elsewhere."""

    def __init__(self, what: str, *, host: str, problem: str, setting: str) -> None:
        self.host, self.problem, self.setting = host, problem, setting
        super().__init__(f"{what}: {host} {problem}; check the network, or set {setting} to a mirror", delay=2.0)


def unreachable_problem(reason: object) -> str:
    """How a connection failed, in words: a name that does not resolve is an offline machine
    (or one without DNS), not a bug."""
    text = str(reason)
    if any(s in text for s in ("Name or service not known", "Temporary failure in name resolution",
                               "nodename nor servname", "No address associated", "[Errno -2]", "[Errno -3]",
                               "[Errno -5]")):
        return "does not resolve (no DNS answer: this Spark looks offline)"
    return f"did not answer ({text.splitlines()[0][:200] if text else 'no reason given'})"


class SpecError(SparkctlError):
    """A stack or patch file is wrong: names the file, the line when known, the key and what is
    allowed."""

    def __init__(self, file: str, key: str, problem: str, *, line: int | None = None) -> None:
        self.file, self.key, self.problem, self.line = file, key, problem, line
        where = ": ".join(part for part in (file, f"line {line}" if line else "", key) if part)
        super().__init__(f"{where}: {problem}")


class NoSuchStack(SpecError):
    """A stack name that no stack file defines (the API's 404)."""


class NoSuchFile(SparkctlError):
    """A file the API was asked for that is not there, or not its to give (the API's 404)."""


class ImageRefused(SparkctlError):
    """The image policy refuses a ref or digest (blacklisted, or an unpinned `latest`)."""


class NoRoom(SparkctlError):
    """The fleet's control plane found no set of hosts with the resources a placement asks for."""


class DockerError(SparkctlError):
    """A Docker engine call failed; carries the call, status and the engine's words."""
