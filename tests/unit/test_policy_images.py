"""The image policy: ref parsing, the blacklist by ref and by digest, the `latest` rule, mirrors, and
what a retest of a banned tag may measure."""

from __future__ import annotations

import datetime as dt

import pytest

from sparkctl.errors import ImageRefused
from sparkctl.policy.images import (
    Ban,
    ImageName,
    ImagePolicy,
    Measurement,
    Pin,
    check,
    mirrored,
    parse_ref,
    plan_retest,
    retestable,
)

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
GEMMA = "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash"


@pytest.mark.parametrize(("ref", "expected"), [
    ("vllm/vllm-openai:gemma", ImageName("docker.io", "vllm/vllm-openai", "gemma")),
    ("ubuntu", ImageName("docker.io", "library/ubuntu")),
    ("docker.io/library/ubuntu:24.04", ImageName("docker.io", "library/ubuntu", "24.04")),
    (f"{GEMMA}:v2", ImageName("ghcr.io", "aeon-7/aeon-gemma-4-26b-a4b-dflash", "v2")),
    ("127.0.0.1:5001/aeon-7/x:v2", ImageName("127.0.0.1:5001", "aeon-7/x", "v2")),
    ("127.0.0.1:5001/aeon-7/x", ImageName("127.0.0.1:5001", "aeon-7/x")),
    (f"localhost/x@{D1}", ImageName("localhost", "x", None, D1)),
    (f"ghcr.io/a/b:t@{D1}", ImageName("ghcr.io", "a/b", "t", D1)),
])
def test_parse_ref(ref: str, expected: ImageName) -> None:
    assert parse_ref(ref) == expected


@pytest.mark.parametrize("ref", ["", "UPPER/case", "a b", "x:y:z:w/q", f"x@{D1[:20]}"])
def test_parse_ref_rejects_nonsense(ref: str) -> None:
    with pytest.raises(ImageRefused, match="not an image reference"):
        parse_ref(ref)


POLICY = ImagePolicy(
    pins={"vllm/vllm-openai:v0.24.0": Pin(digest=D1, provenance="run 3", known_good=True)},
    blacklist={
        f"{GEMMA}:latest": Ban(reason="acceptance ~10%", date=dt.date(2026, 6, 10)),
        D2: Ban(reason="acceptance 0.10 < 0.40 floor, run 17"),
    },
)


@pytest.mark.parametrize(("ref", "digest", "allow_latest", "refusal"), [
    (f"{GEMMA}:v2", None, False, None),
    (f"{GEMMA}:latest", None, True, "blacklisted since 2026-06-10: acceptance ~10%"),
    (f"{GEMMA}:latest@{D1}", None, True, "blacklisted"),  # a ban on the tag holds for any digest
    (f"{GEMMA}:v3", D2, False, "acceptance 0.10 < 0.40 floor, run 17"),  # banned digest after resolution
    (f"{GEMMA}@{D2}", None, False, "run 17"),
    ("vllm/vllm-openai:latest", None, False, "moving tag (latest)"),
    ("vllm/vllm-openai", None, False, "moving tag (untagged)"),
    ("vllm/vllm-openai:latest", None, True, None),
    (f"vllm/vllm-openai@{D1}", None, False, None),  # a digest does not move
    ("docker.io/vllm/vllm-openai:v0.24.0", D1, False, None),
])
def test_check(ref: str, digest: str | None, allow_latest: bool, refusal: str | None) -> None:
    if refusal is None:
        check(POLICY, ref, digest=digest, allow_latest=allow_latest)
        return
    with pytest.raises(ImageRefused, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        check(POLICY, ref, digest=digest, allow_latest=allow_latest)


def test_refusal_says_how_to_undo() -> None:
    """A banned tag is re-measured (`image retest`); a banned digest never changes, so it is lifted by hand."""
    with pytest.raises(ImageRefused, match=f"sparkctl image retest {GEMMA}:latest"):
        check(POLICY, f"{GEMMA}:latest")
    digest_ban = POLICY.model_copy(update={"blacklist": {D1: Ban(reason="crashes")}})
    with pytest.raises(ImageRefused, match=f"sparkctl image unblacklist {D1}"):
        check(digest_ban, f"{GEMMA}:v2", digest=D1)


def test_pin_for_matches_any_spelling() -> None:
    assert POLICY.pin_for("docker.io/vllm/vllm-openai:v0.24.0").digest == D1
    assert POLICY.pin_for(f"vllm/vllm-openai:v0.24.0@{D2}").digest == D1
    assert POLICY.pin_for("vllm/vllm-openai:v0.25.0") is None


@pytest.mark.parametrize(("ref", "mirrors", "expected"), [
    (f"{GEMMA}:v2", {"ghcr.io": "127.0.0.1:5001"}, "127.0.0.1:5001/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2"),
    ("vllm/vllm-openai:gemma", {"docker.io": "127.0.0.1:5001"}, "127.0.0.1:5001/vllm/vllm-openai:gemma"),
    ("vllm/vllm-openai:gemma", {"ghcr.io": "127.0.0.1:5001"}, "docker.io/vllm/vllm-openai:gemma"),
    (f"ghcr.io/a/b@{D1}", {"ghcr.io": "m:1"}, f"m:1/a/b@{D1}"),
])
def test_mirrored(ref: str, mirrors: dict, expected: str) -> None:
    assert mirrored(parse_ref(ref), mirrors) == expected


# Re-qualifying a banned tag (`sparkctl image retest`): what may be measured, what its trial runs past.

D3 = "sha256:" + "3" * 64
LATEST = f"{GEMMA}:latest"
MEASURED = Ban(reason="acceptance ~10%", date=dt.date(2026, 6, 10), digest=D1,
               retests=(Measurement(date=dt.date(2026, 7, 1), digest=D2, verdict="fail: acceptance 0.10", run=4),))


@pytest.mark.parametrize(("blacklist", "digest", "force", "key", "lift", "refusal"), [
    ({LATEST: Ban(reason="broken")}, D3, False, LATEST, (LATEST,), None),  # never measured: go
    ({LATEST: MEASURED}, D3, False, LATEST, (LATEST,), None),  # the tag moved since
    ({LATEST: MEASURED}, D1, False, None, None, "still names " + D1 + ", the digest its ban"),
    ({LATEST: MEASURED}, D2, False, None, None, "nothing changed"),  # a failed retest's digest
    ({LATEST: MEASURED}, D1, True, LATEST, (LATEST,), None),
    ({LATEST: MEASURED, D3: Ban(reason="canary 0.10")}, D3, False, None, None, "blacklisted itself (" + D3),
    ({LATEST: MEASURED, D3: Ban(reason="canary 0.10")}, D3, True, LATEST, (LATEST, D3), None),
    ({f"{GEMMA}:next@{D3}": Ban(reason="x")}, D3, True, f"{GEMMA}:next@{D3}", (f"{GEMMA}:next@{D3}",), None),
    ({D3: Ban(reason="canary 0.10")}, D3, True, D3, (D3,), None),  # the tag itself was never banned
    ({f"{GEMMA}:v2": Ban(reason="x")}, D3, False, None, None, "is not blacklisted: there is nothing to"),
    ({}, D3, True, None, None, "is not blacklisted"),
])
def test_plan_retest(blacklist, digest, force, key, lift, refusal) -> None:
    policy = ImagePolicy(blacklist=blacklist)
    if refusal:
        with pytest.raises(ImageRefused, match=refusal.replace("(", r"\(")):
            plan_retest(policy, LATEST, digest, force=force)
        return
    retrial = plan_retest(policy, LATEST, digest, force=force)
    assert (retrial.key, retrial.lift, retrial.digest, retrial.name.tagged) == (key, lift, digest, LATEST)


@pytest.mark.parametrize("ref", [f"{GEMMA}@{D1}", f"{GEMMA}:latest@{D1}", GEMMA])
def test_retest_takes_a_tag(ref: str) -> None:
    with pytest.raises(ImageRefused, match="retest takes a tag"):
        plan_retest(POLICY, ref, D1, force=True)


def test_a_trial_policy_runs_past_only_the_lifted_bans() -> None:
    trial = POLICY.without((LATEST,))
    check(trial, f"{LATEST}@{D1}", allow_latest=True)
    with pytest.raises(ImageRefused, match="run 17"):
        check(trial, f"{LATEST}@{D2}", allow_latest=True)
    assert LATEST in POLICY.blacklist  # the policy itself is unchanged


def test_a_ban_knows_the_digests_it_was_measured_on() -> None:
    assert MEASURED.measured() == {D1, D2}
    assert Ban(reason="x").measured() == set()


def test_an_unbanned_tag_is_refused_before_any_registry_is_asked() -> None:
    with pytest.raises(ImageRefused, match="is not blacklisted"):
        retestable(ImagePolicy(blacklist={f"{GEMMA}:v2": Ban(reason="x")}), LATEST)
    assert retestable(ImagePolicy(blacklist={LATEST: Ban(reason="x")}), LATEST).tag == "latest"
    assert retestable(ImagePolicy(blacklist={D3: Ban(reason="x")}), LATEST)  # its digest may be the banned one
