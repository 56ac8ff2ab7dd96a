"""Image drift across the fleet: whether every host holds the same image under a ref, judged by
registry digest (RepoDigest), before anything starts. Pure; `sparkctl fleet check-image` asks
the agents and prints the verdict.

A host's digest is its Docker's RepoDigest for the ref's repository. `docker load` drops
RepoDigests; such a host still counts as holding digest D when its image id (the digest of the
image's config, which names every layer) equals that of a host whose Docker records D. The
expected digest is the one the ref names, else the one sparkctl recorded for the tag, else the
one most hosts hold. Every host that differs, lacks the image, or did not answer is named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from sparkctl.node import AgentAnswer


@dataclass(frozen=True)
class HostImage:
    host: str
    present: bool
    image_id: str | None = None
    repo_digest: str | None = None  # None: the host's Docker records none (e.g. after `docker load`)


@dataclass(frozen=True)
class Verdict:
    ref: str
    expected: str | None
    digests: dict[str, str | None]  # host -> the digest it holds (inferred where load lost it)
    differences: dict[str, str]  # host -> how it differs; empty when every host agrees

    @property
    def same(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {"ref": self.ref, "expected": self.expected, "same": self.same, "digests": self.digests,
                "differences": self.differences}


def images(answers: list[AgentAnswer]) -> tuple[list[HostImage], dict[str, str]]:
    """The agents' `image_digest` (or `pull`) answers as HostImages, and the hosts without one."""
    found = [HostImage(host=a.host, present=bool(a.value["present"]), image_id=a.value.get("image_id"),
                       repo_digest=a.value.get("repo_digest")) for a in answers if a.ok]
    return found, {a.host: a.error or "" for a in answers if not a.ok}


def verdict(ref: str, hosts: list[HostImage], *, wanted: str | None = None,
            unreachable: dict[str, str] | None = None) -> Verdict:
    """Compare every host's digest for `ref` with the expected one (`wanted`, else the majority)."""
    digests = {h.host: _digest(h, hosts) for h in hosts}
    expected = wanted or _majority([d for d in digests.values() if d])
    holders = [h for h, d in digests.items() if d == expected]
    differences = {host: f"could not be asked: {why}" for host, why in (unreachable or {}).items()}
    for host in hosts:
        problem = _difference(ref, host, digests[host.host], expected, holders, named=wanted is not None)
        if problem:
            differences[host.host] = problem
    return Verdict(ref=ref, expected=expected, digests=digests, differences=differences)


def _digest(host: HostImage, hosts: list[HostImage]) -> str | None:
    if host.repo_digest or not host.present:
        return host.repo_digest
    same = {h.repo_digest for h in hosts if h.repo_digest and h.image_id == host.image_id}
    return same.pop() if len(same) == 1 else None


def _majority(digests: list[str]) -> str | None:
    if not digests:
        return None
    counts = Counter(digests)
    best = max(counts.values())
    return next(d for d in digests if counts[d] == best)  # a tie goes to the first host's


def _difference(ref: str, host: HostImage, digest: str | None, expected: str | None, holders: list[str], *,
                named: bool) -> str | None:
    if not host.present:
        return f"has no image {ref}: pull it by digest there ({ref.split('@')[0]}@{expected or 'sha256:...'})"
    if digest is None:
        return (f"has {ref} as image {_short(host.image_id)} with no RepoDigest (`docker load` drops it) and no "
                "other host holds that image by digest: pull it by digest there")
    if expected is None or digest == expected:
        return None
    where = f"{ref.split('@')[0]}@{_short(expected)} is expected" if named and not holders else \
        f"{', '.join(holders) or 'the ref'} {'has' if len(holders) == 1 else 'have'} {_short(expected)}"
    return f"has {_short(digest)} where {where}"


def _short(digest: str | None) -> str:
    return (digest or "?")[:19]
