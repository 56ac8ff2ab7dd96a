"""The image policy's edits by hand (`sparkctl image pin | unpin | blacklist | unblacklist |
forget-wake`), made by the daemon, which owns `images.yaml` and edits it itself (a retest, a wake
record, a first deploy's pin, a gate's known-good pin): each edit a round trip of the file
(`spec/imagefile.py`), so none is lost to another."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sparkctl.errors import SparkctlError
from sparkctl.messages import ImageEdit, ImageEdited
from sparkctl.policy.images import DIGEST, ImagePolicy, check, parse_ref
from sparkctl.spec import imagefile


class ImageBook:
    def __init__(self, *, path: Path, policy: Callable[[], ImagePolicy], registry_digest: Callable[[str], str]
                 ) -> None:
        self.path, self.policy, self.registry_digest = path, policy, registry_digest

    def edit(self, ask: ImageEdit) -> ImageEdited:
        ref = ask.ref
        match ask.edit:
            case "pin":
                name = parse_ref(ref)
                digest = ask.digest or self.registry_digest(str(name))
                check(self.policy(), ref, digest=digest, allow_latest=True)
                imagefile.pin(self.path, ref, digest=digest, provenance=ask.provenance)
                return ImageEdited(ask.edit, name.tagged, digest)
            case "blacklist":
                if not ask.reason:
                    raise SparkctlError("a blacklist entry needs its reason (--reason), for whoever meets the refusal")
                if ask.digest and not DIGEST.match(ask.digest):
                    raise SparkctlError(f"--digest takes sha256:<64 hex>, got {ask.digest!r}")
                imagefile.blacklist(self.path, ref, reason=ask.reason, digest=ask.digest or None)
            case "unpin" if not imagefile.unpin(self.path, ref):
                raise SparkctlError(f"{ref} is not pinned; `sparkctl image list` shows the pins")
            case "unblacklist" if not imagefile.unblacklist(self.path, ref):
                raise SparkctlError(f"{ref} is not blacklisted; `sparkctl image list` shows the blacklist")
            case "forget-wake" if not imagefile.forget_wake(self.path, ref):
                raise SparkctlError(f"{ref} has no wake record; `sparkctl image list` shows them")
        return ImageEdited(ask.edit, ref)
