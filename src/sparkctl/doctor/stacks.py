"""The doctor's checks of what the stacks need: their registries and the Hub answering (with the
HF token's access to gated repos, never shown), each stack's image policy verdict, pin and sleep
mode record, and free disk for the images and weights still to fetch. Each reads through
`Spark` (doctor/spark.py); each returns its `Check`s."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sparkctl.adapters.hub import cached_snapshot
from sparkctl.deploy.image import PULL_FACTOR
from sparkctl.deploy.weights import HEADROOM, existing
from sparkctl.doctor import Check, fail, ok, warn
from sparkctl.doctor.spark import Spark
from sparkctl.errors import SparkctlError, Unreachable
from sparkctl.policy.images import check as policy_check


def registries(spark: Spark) -> list[Check]:
    checks = []
    for ref, size in sorted(spark.image_bytes.items()):
        where = spark.source(ref)
        if isinstance(size, Unreachable):
            checks.append(fail("registry", f"image {ref}", f"{size.host} {size.problem}",
                               f"connect this Spark to the network, or set {size.setting} to a mirror that has it"))
        elif isinstance(size, SparkctlError):
            checks.append(fail("registry", f"image {ref}", f"{where}: {size}",
                               "fix the image reference in the stack, or set SPARKCTL_REGISTRY_MIRRORS to a mirror "
                               "that has it"))
        else:
            checks.append(ok("registry", f"image {ref}", f"{where} serves it, {size / 1e9:.2f} GB compressed"))
    return checks


def hub(spark: Spark) -> list[Check]:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return [_cached(spark, w.repo, w.revision) for w in spark.weights]
    token = "with the HF token" if spark.settings.hf_token else "without an HF token"
    checks = []
    for (repo, revision), snapshot in sorted(spark.snapshots.items()):
        if isinstance(snapshot, Unreachable):
            checks.append(fail("hub", f"hub {repo}", f"the Hub at {snapshot.host} {snapshot.problem} ({token})",
                               f"connect this Spark to the network, or set {snapshot.setting} to a Hub mirror; "
                               "with the weights already in the cache, HF_HUB_OFFLINE=1 needs no network"))
        elif isinstance(snapshot, SparkctlError):
            gated = "gated" in str(snapshot)
            fix = ("accept the model's terms on its Hub page, then set SPARKCTL_HF_TOKEN to a token with read "
                   "access" if gated else "check the network, SPARKCTL_HF_ENDPOINT, or the repo and revision")
            checks.append(fail("hub", f"hub {repo}", f"{snapshot} ({token})", fix))
        else:
            checks.append(ok("hub", f"hub {repo}", f"{revision} is commit {snapshot.commit[:12]}, "
                             f"{snapshot.size / 1e9:.2f} GB ({token})"))
    return checks


def stacks(spark: Spark) -> list[Check]:
    checks = [fail("stacks", f"stack {name}", why, "fix the stack file it names, or the name")
              for name, why in spark.unknown.items()]
    if not spark.names:
        return [ok("stacks", "stacks", "no stack is desired yet: name some (`sparkctl doctor STACK…`) to "
                   "check what they need")]
    for stack in spark.stacks:
        name, ref = f"stack {stack.name}", stack.image.ref
        try:
            policy_check(spark.policy, ref, allow_latest=stack.image.allow_latest)
        except SparkctlError as e:
            checks.append(fail("stacks", name, str(e), "use a known-good tag in the stack file"))
            continue
        pin = spark.policy.pin_for(ref)
        digest = stack.image.digest or (pin.digest if pin else None)
        if digest is None:
            checks.append(warn("stacks", name, f"{ref} is not pinned: the first `up` pins what the tag names then",
                               f"`sparkctl up {stack.name}`, then `sparkctl bench run {stack.name}` to vouch for it"))
            continue
        trust = ("known good" if pin and pin.known_good else "first seen, not yet vouched for by a benchmark"
                 if pin and pin.first_seen else "pinned")
        checks.append(ok("stacks", name, f"{ref} → {digest[:19]}… ({trust}); {_sleep(spark, digest)}"))
    return checks


def disk(spark: Spark) -> list[Check]:
    """Free space against what is still to fetch: images the engine lacks, at PULL_FACTOR times
    their compressed size, in its root dir; weights not yet in the HF cache, in the cache. Free
    space is local: it is reported even when a registry or the Hub cannot be reached, with what
    could then not be sized."""
    facts = spark.engine
    needs: dict[Path, list[tuple[str, int]]] = {}
    unsized: dict[Path, list[str]] = {}
    hub = spark.wiring.hub()
    if not isinstance(facts, SparkctlError) and Path(facts.root_dir).is_dir():
        root = existing(Path(facts.root_dir))
        needs[root] = []
        for ref, size in spark.image_bytes.items():
            if spark.wiring.docker.image(ref) is not None:
                continue
            if isinstance(size, int):
                needs[root].append((ref, size * PULL_FACTOR))
            else:
                unsized.setdefault(root, []).append(ref)
    cache = existing(hub.cache_dir)
    needs.setdefault(cache, [])
    for (repo, _), snapshot in spark.snapshots.items():
        if isinstance(snapshot, SparkctlError):
            unsized.setdefault(cache, []).append(repo)
        elif missing := hub.missing_bytes(snapshot):
            needs[cache].append((snapshot.repo, missing))
    checks = []
    for folder, wanted in _by_device(needs).items():
        free, total = shutil.disk_usage(folder).free, sum(size for _, size in wanted)
        blind = [what for f, whats in unsized.items() if f.stat().st_dev == folder.stat().st_dev for what in whats]
        found = f"{free / 1e9:.1f} GB free, " + (
            f"{total / 1e9:.1f} GB to fetch: " + ", ".join(f"{what} {size / 1e9:.1f} GB" for what, size in wanted)
            if wanted else "nothing to fetch here")
        if blind:
            found += f"; could not be sized (unreachable): {', '.join(blind)}"
        if total + HEADROOM > free:
            checks.append(fail("disk", f"disk {folder}", f"{found} (+{HEADROOM / 1e9:.1f} GB headroom)",
                               f"free space on {folder}, or point SPARKCTL_HF_CACHE_DIR (weights) or Docker's "
                               "data-root (images) at a larger disk"))
        elif blind:
            checks.append(warn("disk", f"disk {folder}", found, "once the network is back, `sparkctl doctor` sizes "
                               "what is left"))
        else:
            checks.append(ok("disk", f"disk {folder}", found))
    return checks


def _sleep(spark: Spark, digest: str) -> str:
    wake = spark.policy.wakes.get(digest)
    if wake is None:
        return "sleep mode not yet tried on this digest"
    return "sleep mode works on this digest" if wake.ok else f"sleep mode fails on this digest ({wake.reason})"


def _cached(spark: Spark, repo: str, revision: str) -> Check:
    try:
        folder = cached_snapshot(spark.settings.hf_cache_dir, repo, revision)
    except SparkctlError as e:
        return fail("hub", f"hub {repo}", f"offline (HF_HUB_OFFLINE) and {e}", "unset HF_HUB_OFFLINE for the "
                    "first `up`, or copy the weights into the cache")
    return ok("hub", f"hub {repo}", f"offline (HF_HUB_OFFLINE); {revision} is in the cache at {folder}")


def _by_device(needs: dict[Path, list[tuple[str, int]]]) -> dict[Path, list[tuple[str, int]]]:
    """Folders on one filesystem share its free space: their needs are summed under the first."""
    merged: dict[int, tuple[Path, list[tuple[str, int]]]] = {}
    for folder, wanted in needs.items():
        merged.setdefault(folder.stat().st_dev, (folder, []))[1].extend(wanted)
    return dict(merged.values())
