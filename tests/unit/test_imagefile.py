"""Editing images.yaml keeps its comments and order, and refuses to write a bad file."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from sparkctl.errors import SpecError
from sparkctl.spec import imagefile

D1 = "sha256:" + "a" * 64
SHIPPED = Path(__file__).resolve().parents[2] / "stacks" / "images.yaml"


def test_edits_keep_comments_and_order(workspace: Path, cli) -> None:
    path = workspace / "stacks" / "images.yaml"
    before = path.read_text()
    assert cli("image", "pin", "vllm/vllm-openai:v0.24.0", "--digest", D1, "--provenance", "run 3")[0] == 0
    assert cli("image", "blacklist", "eugr/spark-vllm:latest", "--reason", "crashes at load")[0] == 0
    text = path.read_text()
    for line in before.splitlines():
        if line.startswith("#"):
            assert line in text
    assert text.index("\npins:") < text.index("docker.io/vllm/vllm-openai:v0.24.0") < text.index("\nblacklist:")
    assert text.index("aeon-gemma-4-26b-a4b-dflash:latest") < text.index("eugr/spark-vllm:latest")
    policy = imagefile.load_policy(path)
    assert policy.pin_for("vllm/vllm-openai:v0.24.0").provenance == "run 3"
    code, _, err = cli("image", "check", "eugr/spark-vllm:latest", "--allow-latest")
    assert code == 1 and "crashes at load" in err

    assert cli("image", "unpin", "vllm/vllm-openai:v0.24.0")[0] == 0
    assert cli("image", "unblacklist", "docker.io/eugr/spark-vllm:latest")[0] == 0
    assert imagefile.load_policy(path).pins == imagefile.load_policy(SHIPPED).pins
    assert cli("image", "check", "eugr/spark-vllm:latest", "--allow-latest")[0] == 0
    for line in before.splitlines():
        assert line in path.read_text() or line == "pins: {}"


def test_unknown_entries_are_errors(workspace: Path, cli) -> None:
    code, _, err = cli("image", "unpin", "vllm/vllm-openai:v9")
    assert code == 1 and "is not pinned" in err
    code, _, err = cli("image", "unblacklist", "vllm/vllm-openai:v9")
    assert code == 1 and "is not blacklisted" in err


def test_blacklist_a_bare_digest(workspace: Path, cli) -> None:
    assert cli("image", "blacklist", D1, "--reason", "acceptance 0.10 < 0.40, run 17")[0] == 0
    code, _, err = cli("image", "check", "ghcr.io/x/y:v1", "--digest", D1)
    assert code == 1 and "run 17" in err


def test_a_broken_file_names_itself(workspace: Path, cli) -> None:
    (workspace / "stacks" / "images.yaml").write_text("pins:\n  x:v1:\n    digest: nope\n")
    code, _, err = cli("image", "list")
    assert code == 1 and "images.yaml: pins.x:v1.digest" in err


@pytest.mark.parametrize(("ref", "said"), [
    ("ghcr.io/aeon-7/vllm-aeon-ultimate-dflash:qwen36-v4", "seed 003:21,25"),  # "ran about a month, stable"
    ("ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2", "seed 003:31,37"),  # "the v2 image is the one that works"
])
def test_a_known_good_tag_without_a_digest_is_pinned_by_its_first_deploy(workspace: Path, cli, monkeypatch,
                                                                          ref: str, said: str) -> None:
    """Seed 003's known-good tags (qwen36-v4, Gemma-4's v2) ship pinned without a digest (none was
    published): the first deploy's digest fills the pin in, once; later deploys and unpinned tags
    change nothing."""
    path = workspace / "stacks" / "images.yaml"
    shipped = imagefile.load_policy(path).pin_for(ref)
    assert shipped.known_good and not shipped.settled and shipped.provenance.startswith(said)
    code, out, _ = cli("image", "check", ref)
    assert code == 0 and "pinned to (none yet: the first `up` records it)" in out

    assert imagefile.settle_pin(path, ref, digest=D1)
    settled = imagefile.load_policy(path).pin_for(ref)
    # first seen, not known-good: the seed vouches for the build it ran, not for what the tag names now
    assert (settled.digest, settled.known_good, settled.first_seen) == (D1, False, dt.date.today())
    assert settled.provenance.startswith(said)
    assert "digest recorded at first deploy on" in settled.provenance
    assert not imagefile.settle_pin(path, ref, digest="sha256:" + "b" * 64)  # pinned now: a moved tag stays pinned
    assert not imagefile.settle_pin(path, "vllm/vllm-openai:v0.24.0", digest=D1)  # no pin: nothing to settle
    policy = imagefile.load_policy(path)
    assert policy.pin_for(ref).digest == D1 and policy.pin_for("vllm/vllm-openai:v0.24.0") is None
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = cli("image", "list")
    assert code == 0 and f"not yet: first seen {dt.date.today()}" in out
    imagefile.pin(path, ref, digest=D1, known_good=True, provenance="benchmark run 3 passed")  # as the gate does
    passed = imagefile.load_policy(path).pin_for(ref)
    assert (passed.known_good, passed.first_seen) == (True, None)
    text = path.read_text()
    assert all(line in text for line in SHIPPED.read_text().splitlines() if line.startswith("#"))


POLICY_TEXT = """# the policy
pins: {}
blacklist:
  # broken since June
  ghcr.io/a/b:latest:
    reason: acceptance ~10%
    date: 2026-06-10
  eugr/spark-vllm:latest:
    reason: crashes at load
"""


def test_a_failed_retest_is_appended_to_its_ban_in_place(tmp_path: Path) -> None:
    import datetime as dt

    from sparkctl.policy.images import Measurement

    path = tmp_path / "images.yaml"
    path.write_text(POLICY_TEXT)
    first = Measurement(date=dt.date(2026, 7, 1), digest=D1, verdict="fail: acceptance 0.10 < 0.40 floor (run 4)",
                        run=4, deployment=9)
    second = Measurement(date=dt.date(2026, 7, 2), digest=D1, verdict="fail: canary", deployment=11)
    assert imagefile.record_retest(path, "ghcr.io/a/b:latest", first)
    assert imagefile.record_retest(path, "ghcr.io/a/b:latest", second)
    text = path.read_text()
    assert "# the policy" in text and "# broken since June" in text
    assert text.index("ghcr.io/a/b:latest") < text.index("retests:") < text.index("eugr/spark-vllm:latest")
    ban = imagefile.load_policy(path).blacklist["ghcr.io/a/b:latest"]
    assert ban.retests == (first, second) and ban.reason == "acceptance ~10%"
    assert not imagefile.record_retest(path, "ghcr.io/a/b:v9", first)  # lifted meanwhile: nothing to add to


def test_a_passed_retest_lifts_its_bans_and_pins_in_one_edit(tmp_path: Path) -> None:
    path = tmp_path / "images.yaml"
    path.write_text(POLICY_TEXT.replace("blacklist:\n", f"blacklist:\n  {D1}:\n    reason: canary\n"))
    pin = imagefile.requalify(path, lift=("ghcr.io/a/b:latest", D1), ref="ghcr.io/a/b:latest", digest=D1,
                              provenance="retest with s: benchmark run 5 passed its gate")
    policy = imagefile.load_policy(path)
    assert list(policy.blacklist) == ["eugr/spark-vllm:latest"]
    assert policy.pin_for("ghcr.io/a/b:latest") == pin and pin.known_good and "run 5" in pin.provenance
    assert "# the policy" in path.read_text()


def test_blacklist_records_what_the_tag_names(workspace: Path, cli) -> None:
    assert cli("image", "blacklist", "eugr/spark-vllm:latest", "--reason", "crashes", "--digest", D1)[0] == 0
    ban = imagefile.load_policy(workspace / "stacks" / "images.yaml").ban_for("eugr/spark-vllm:latest")[1]
    assert ban.digest == D1 and ban.reason == "crashes"
    code, _, err = cli("image", "blacklist", "eugr/spark-vllm:latest", "--reason", "x", "--digest", "sha256:nope")
    assert code == 1 and "--digest takes sha256:<64 hex>" in err and "Traceback" not in err


def test_image_list_shows_the_last_retest_of_a_ban(workspace: Path, cli) -> None:
    path = workspace / "stacks" / "images.yaml"
    path.write_text(POLICY_TEXT.replace("    date: 2026-06-10\n", "    date: 2026-06-10\n    retests:\n"
                                        f"    - {{date: 2026-07-01, digest: '{D1}', verdict: 'fail: canary', "
                                        "deployment: 3}\n"))
    code, out, _ = cli("image", "list")
    cells = " ".join(line.split("│")[4].strip() for line in out.splitlines() if line.count("│") == 5)
    assert code == 0 and "2026-07-01 sha256:aaaaaaaaaaaa: fail: canary (1 in all)" in cells


def test_a_value_the_reader_cannot_build_is_this_files_error_for_reads_and_edits(tmp_path: Path) -> None:
    """A month 13 in images.yaml escaped as a ValueError, and the daemon reads the policy for
    `status`: every command answered 500. It is this file's error now, placed on its line; an edit
    (whose round trip builds dates) refuses a date-like text it cannot build rather than raise."""
    path = tmp_path / "images.yaml"
    path.write_text(POLICY_TEXT.replace("date: 2026-06-10", "date: 2026-13-45"))
    with pytest.raises(SpecError, match=r"images\.yaml: blacklist\.ghcr\.io/a/b:latest\.date: .*date"):
        imagefile.load_policy(path)
    path.write_text(POLICY_TEXT.replace("reason: crashes at load", "reason: 2026-13-45"))
    assert imagefile.load_policy(path).blacklist["eugr/spark-vllm:latest"].reason == "2026-13-45"
    with pytest.raises(SpecError, match=r"images\.yaml: line 9: invalid YAML: cannot read '2026-13-45' as "
                                        r"!!timestamp \(month must be in 1\.\.12\); quote it if it is text"):
        imagefile.pin(path, "ghcr.io/a/b:v1", digest=D1)
    path.write_text(POLICY_TEXT.replace("reason: crashes at load", "reason: crashes\n    retests: !!binary x"))
    with pytest.raises(SpecError, match=r"images\.yaml: line 10: invalid YAML: the tag !!binary"):
        imagefile.pin(path, "ghcr.io/a/b:v1", digest=D1)
