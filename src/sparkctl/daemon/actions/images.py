"""The image policy's edits by hand (`sparkctl image pin | unpin | blacklist | unblacklist |
forget-wake`), made by the daemon, which owns the policy's state layer and records into it itself
(a retest, a wake, a first deploy's pin, a gate's known-good pin): each edit one short transaction
of the store's image records (`state/images.py`); the shipped and the owner's `images.yaml` are
never written."""

from __future__ import annotations

from collections.abc import Callable

from sparkctl.errors import SparkctlError
from sparkctl.messages import ImageEdit, ImageEdited
from sparkctl.policy.images import DIGEST, ImagePolicy, check, parse_ref
from sparkctl.state.images import ImageRecords


class ImageBook:
    def __init__(self, *, records: ImageRecords, policy: Callable[[], ImagePolicy],
                 registry_digest: Callable[[str], str]) -> None:
        self.records, self.policy, self.registry_digest = records, policy, registry_digest

    def edit(self, ask: ImageEdit) -> ImageEdited:
        ref = ask.ref
        match ask.edit:
            case "pin":
                name = parse_ref(ref)
                digest = ask.digest or self.registry_digest(str(name))
                check(self.policy(), ref, digest=digest, allow_latest=True)
                self.records.pin(ref, digest=digest, provenance=ask.provenance)
                return ImageEdited(ask.edit, name.tagged, digest)
            case "blacklist":
                if not ask.reason:
                    raise SparkctlError("a blacklist entry needs its reason (--reason), for whoever meets the refusal")
                if ask.digest and not DIGEST.match(ask.digest):
                    raise SparkctlError(f"--digest takes sha256:<64 hex>, got {ask.digest!r}")
                self.records.blacklist(ref, reason=ask.reason, digest=ask.digest or None)
            case "unpin" if not self.records.unpin(ref):
                raise SparkctlError(f"{ref} is not pinned; `sparkctl image list` shows the pins")
            case "unblacklist" if not self.records.unblacklist(ref):
                raise SparkctlError(f"{ref} is not blacklisted; `sparkctl image list` shows the blacklist")
            case "forget-wake" if not self.records.forget_wake(ref):
                raise SparkctlError(f"{ref} has no wake record; `sparkctl image list` shows them")
        return ImageEdited(ask.edit, ref)
