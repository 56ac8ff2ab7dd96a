"""The image policy's layers: the shipped images.yaml and the owner's are read only, everything
sparkctl records (the `image` commands, a settled pin, a gate's pin or ban, a retest, the wake
ledger) is state, laid over them; an older version's edits of a checkout's file are imported once."""

from __future__ import annotations

import datetime as dt
import shutil
import subprocess
from pathlib import Path

import pytest

from sparkctl.errors import SpecError
from sparkctl.policy.images import Layer, Measurement
from sparkctl.spec import imagefile
from sparkctl.spec.imagefile import PolicyFiles
from sparkctl.state import db as database
from sparkctl.state.store import Store

D1 = "sha256:" + "a" * 64
D2 = "sha256:" + "b" * 64
ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "stacks" / "images.yaml"
V4 = "ghcr.io/aeon-7/vllm-aeon-ultimate-dflash:qwen36-v4"  # shipped: pinned without a digest
GEMMA_V2 = "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2"  # so is this
BANNED = "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:latest"  # shipped: blacklisted


def rows(out: str, title: str) -> list[list[str]]:
    """The cells of each row of the table titled `title` in `out` (rich's box drawing)."""
    found = []
    for line in out[out.index(title):].splitlines()[1:]:
        if line.startswith(("└", "┗")):
            break
        if "│" in line:
            found.append([cell.strip() for cell in line.split("│")[1:-1]])
    return found


def records(path: Path, shipped: Path, owner: Path | None = None) -> Store:
    return Store(path, policy_files=PolicyFiles(shipped, owner))


def test_commands_record_in_the_state_and_never_write_the_shipped_file(workspace: Path, cli, monkeypatch) -> None:
    shipped = workspace / "stacks" / "images.yaml"
    before = shipped.read_bytes()
    shipped.chmod(0o444)
    (workspace / "stacks").chmod(0o555)  # as a system-wide install is: sparkctl may not write there
    try:
        assert cli("image", "pin", "vllm/vllm-openai:v0.24.0", "--digest", D1, "--provenance", "run 3")[0] == 0
        assert cli("image", "blacklist", "eugr/spark-vllm:latest", "--reason", "crashes at load")[0] == 0
        code, _, err = cli("image", "check", "eugr/spark-vllm:latest", "--allow-latest")
        assert code == 1 and "crashes at load" in err
        monkeypatch.setenv("COLUMNS", "400")
        code, out, _ = cli("image", "list", "-o", "wide")
        assert code == 0
        assert ["docker.io/vllm/vllm-openai:v0.24.0", D1, "", "run 3", str(dt.date.today()), "state"] in \
            rows(out, "pins")
        assert [BANNED, "shipped"] == [rows(out, "blacklist")[0][0], rows(out, "blacklist")[0][-1]]
        assert ["docker.io/eugr/spark-vllm:latest", "state"] == [rows(out, "blacklist")[1][0],
                                                                 rows(out, "blacklist")[1][-1]]
        assert cli("image", "unpin", "vllm/vllm-openai:v0.24.0")[0] == 0
        assert cli("image", "unblacklist", "docker.io/eugr/spark-vllm:latest")[0] == 0
        assert cli("image", "check", "eugr/spark-vllm:latest", "--allow-latest")[0] == 0
        assert "lifted from" not in cli("image", "list", "-o", "wide")[1]  # removing its own record lifts nothing
    finally:
        (workspace / "stacks").chmod(0o755)
    assert shipped.read_bytes() == before and not (workspace / "stacks" / "images.yaml.lock").exists()
    policy = Store(workspace / "state" / "sparkctl.db").images.policy()  # records only: no files under it
    assert not policy.pins and not policy.blacklist


def test_unpin_and_unblacklist_of_a_shipped_entry_are_recorded_as_the_owners_override(workspace: Path, cli,
                                                                                     monkeypatch) -> None:
    shipped = workspace / "stacks" / "images.yaml"
    before = shipped.read_bytes()
    code, _, err = cli("image", "check", BANNED)
    assert code == 1 and "blacklisted" in err
    assert cli("image", "unblacklist", BANNED)[0] == 0
    assert cli("image", "unpin", V4)[0] == 0
    assert cli("image", "check", BANNED, "--allow-latest")[0] == 0
    assert shipped.read_bytes() == before
    monkeypatch.setenv("COLUMNS", "400")
    out = cli("image", "list", "-o", "wide")[1]
    assert rows(out, "removed by the owner") == [["pins", V4, "shipped"], ["blacklist", BANNED, "shipped"]]
    assert [row[0] for row in rows(out, "pins")] == [GEMMA_V2] and not rows(out, "blacklist")  # the other pin stays
    # banned again by the owner: the record replaces the lift
    assert cli("image", "blacklist", BANNED, "--reason", "still broken")[0] == 0
    out = cli("image", "list", "-o", "wide")[1]
    assert rows(out, "blacklist")[0][:2] == [BANNED, "still broken"]
    assert rows(out, "blacklist")[0][-1] == "state, over shipped"
    assert rows(out, "removed by the owner") == [["pins", V4, "shipped"]]
    code, _, err = cli("image", "unpin", V4)
    assert code == 1 and "is not pinned" in err


def test_the_owners_images_yaml_is_laid_over_the_shipped_one_and_the_state_over_both(workspace: Path, cli,
                                                                                   monkeypatch) -> None:
    config = workspace / "config"
    config.mkdir()
    owner = config / "images.yaml"
    owner.write_text(f"# mine\npins:\n  {V4}:\n    digest: '{D1}'\n    provenance: my own run\n"
                     "blacklist:\n  eugr/spark-vllm:latest:\n    reason: crashes on my Spark\n")
    before = owner.read_bytes()
    code, _, err = cli("image", "check", "eugr/spark-vllm:latest", "--allow-latest")
    assert code == 1 and "crashes on my Spark" in err
    monkeypatch.setenv("COLUMNS", "400")
    out = cli("image", "list", "-o", "wide")[1]
    assert [V4, D1, "", "my own run", "", "owner, over shipped"] in rows(out, "pins")
    assert rows(out, "blacklist")[1][-1] == "owner"
    assert rows(cli("image", "list")[1], "pins")[0][-1] == "owner, over shipped"  # shown without -o wide too
    assert cli("image", "pin", V4, "--digest", D2)[0] == 0  # the state over the owner's file
    assert cli("image", "unblacklist", "eugr/spark-vllm:latest")[0] == 0
    out = cli("image", "list", "-o", "wide")[1]
    assert rows(out, "pins")[0][:2] == [V4, D2] and rows(out, "pins")[0][-1] == "state, over owner"
    assert ["blacklist", "docker.io/eugr/spark-vllm:latest", "owner"] in rows(out, "removed by the owner")
    assert owner.read_bytes() == before
    owner.write_text("pins: {x: 1}\n")
    code, _, err = cli("image", "list")
    assert code == 1 and f"{owner}: pins.x" in err


def test_unknown_entries_are_errors(workspace: Path, cli) -> None:
    code, _, err = cli("image", "unpin", "vllm/vllm-openai:v9")
    assert code == 1 and "is not pinned" in err
    code, _, err = cli("image", "unblacklist", "vllm/vllm-openai:v9")
    assert code == 1 and "is not blacklisted" in err
    code, _, err = cli("image", "forget-wake", D1)
    assert code == 1 and "has no wake record" in err


def test_blacklist_a_bare_digest(workspace: Path, cli) -> None:
    assert cli("image", "blacklist", D1, "--reason", "acceptance 0.10 < 0.40, run 17")[0] == 0
    code, _, err = cli("image", "check", "ghcr.io/x/y:v1", "--digest", D1)
    assert code == 1 and "run 17" in err


def test_a_broken_file_names_itself(workspace: Path, cli) -> None:
    (workspace / "stacks" / "images.yaml").write_text("pins:\n  x:v1:\n    digest: nope\n")
    code, _, err = cli("image", "list")
    assert code == 1 and "images.yaml: pins.x:v1.digest" in err


@pytest.mark.parametrize(("tag", "said"), [
    (V4, "seed 003:21,25"),  # "ran about a month, stable"
    (GEMMA_V2, "seed 003:31,37"),  # "the v2 image is the one that works"
])
def test_a_known_good_tag_without_a_digest_is_pinned_by_its_first_deploy(tmp_path: Path, tag: str, said: str) -> None:
    """Seed 003's known-good tags (qwen36-v4, Gemma-4's v2) ship pinned without a digest (none was
    published): the first deploy's digest fills the pin in, once, in the state; later deploys and
    unpinned tags change nothing, and the shipped file stays as shipped."""
    images = records(tmp_path / "s.db", SHIPPED).images
    shipped = images.policy().pin_for(tag)
    assert shipped.known_good and not shipped.settled and shipped.provenance.startswith(said)

    assert images.settle_pin(tag, digest=D1)
    settled = images.policy().pin_for(tag)
    # first seen, not known-good: the seed vouches for the build it ran, not for what the tag names now
    assert (settled.digest, settled.known_good, settled.first_seen) == (D1, False, dt.date.today())
    assert settled.provenance.startswith(said)
    assert "digest recorded at first deploy on" in settled.provenance
    assert not images.settle_pin(tag, digest=D2)  # pinned now: a moved tag stays pinned
    assert not images.settle_pin("vllm/vllm-openai:v0.24.0", digest=D1)  # no pin: nothing to settle
    layered = images.layered()
    assert layered.origin[("pins", tag)] is Layer.STATE and layered.hidden[("pins", tag)] is Layer.SHIPPED
    assert layered.policy.pin_for("vllm/vllm-openai:v0.24.0") is None
    images.pin(tag, digest=D1, known_good=True, provenance="benchmark run 3 passed")  # as the gate does
    passed = images.policy().pin_for(tag)
    assert (passed.known_good, passed.first_seen) == (True, None)
    assert not imagefile.load_policy(SHIPPED).pin_for(tag).settled


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


def test_a_failed_retest_is_added_to_its_ban_in_the_state(tmp_path: Path) -> None:
    path = tmp_path / "images.yaml"
    path.write_text(POLICY_TEXT)
    images = records(tmp_path / "s.db", path).images
    first = Measurement(date=dt.date(2026, 7, 1), digest=D1, verdict="fail: acceptance 0.10 < 0.40 floor (run 4)",
                        run=4, deployment=9)
    second = Measurement(date=dt.date(2026, 7, 2), digest=D1, verdict="fail: canary", deployment=11)
    assert images.record_retest("ghcr.io/a/b:latest", first)
    assert images.record_retest("ghcr.io/a/b:latest", second)
    ban = images.policy().blacklist["ghcr.io/a/b:latest"]
    assert ban.retests == (first, second) and ban.reason == "acceptance ~10%"
    assert list(images.policy().blacklist) == ["ghcr.io/a/b:latest", "docker.io/eugr/spark-vllm:latest"]
    assert not images.record_retest("ghcr.io/a/b:v9", first)  # lifted meanwhile: nothing to add to
    assert path.read_text() == POLICY_TEXT


def test_a_passed_retest_lifts_its_bans_and_pins_in_one_transaction(tmp_path: Path) -> None:
    path = tmp_path / "images.yaml"
    path.write_text(POLICY_TEXT.replace("blacklist:\n", f"blacklist:\n  {D1}:\n    reason: canary\n"))
    images = records(tmp_path / "s.db", path).images
    pin = images.requalify(lift=("ghcr.io/a/b:latest", D1), ref="ghcr.io/a/b:latest", digest=D1,
                           provenance="retest with s: benchmark run 5 passed its gate")
    layered = images.layered()
    assert list(layered.policy.blacklist) == ["docker.io/eugr/spark-vllm:latest"]
    assert layered.policy.pin_for("ghcr.io/a/b:latest") == pin and pin.known_good and "run 5" in pin.provenance
    assert {(s, k) for s, k, _ in layered.lifted()} == {("blacklist", "ghcr.io/a/b:latest"), ("blacklist", D1)}
    assert "# the policy" in path.read_text() and D1 in path.read_text()


def test_blacklist_records_what_the_tag_names(workspace: Path, cli) -> None:
    assert cli("image", "blacklist", "eugr/spark-vllm:latest", "--reason", "crashes", "--digest", D1)[0] == 0
    ban = Store(workspace / "state" / "sparkctl.db").images.policy().ban_for("eugr/spark-vllm:latest")[1]
    assert ban.digest == D1 and ban.reason == "crashes"
    code, _, err = cli("image", "blacklist", "eugr/spark-vllm:latest", "--reason", "x", "--digest", "sha256:nope")
    assert code == 1 and "--digest takes sha256:<64 hex>" in err and "Traceback" not in err


def test_image_list_shows_the_last_retest_of_a_ban(workspace: Path, cli, monkeypatch) -> None:
    path = workspace / "stacks" / "images.yaml"
    path.write_text(POLICY_TEXT.replace("    date: 2026-06-10\n", "    date: 2026-06-10\n    retests:\n"
                                        f"    - {{date: 2026-07-01, digest: '{D1}', verdict: 'fail: canary', "
                                        "deployment: 3}\n"))
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = cli("image", "list", "-o", "wide")
    assert code == 0 and rows(out, "blacklist")[0][3] == "2026-07-01 sha256:aaaaaaaaaaaa: fail: canary (1 in all)"


def test_a_value_the_reader_cannot_build_is_this_files_error(tmp_path: Path) -> None:
    """A month 13 in images.yaml escaped as a ValueError, and the daemon reads the policy for
    `status`: every command answered 500. It is this file's error now, placed on its line."""
    path = tmp_path / "images.yaml"
    path.write_text(POLICY_TEXT.replace("date: 2026-06-10", "date: 2026-13-45"))
    with pytest.raises(SpecError, match=r"images\.yaml: blacklist\.ghcr\.io/a/b:latest\.date: .*date"):
        imagefile.load_policy(path)
    path.write_text(POLICY_TEXT.replace("reason: crashes at load", "reason: 2026-13-45"))
    assert imagefile.load_policy(path).blacklist["eugr/spark-vllm:latest"].reason == "2026-13-45"


def test_the_wake_ledger_is_state(tmp_path: Path) -> None:
    path = tmp_path / "images.yaml"
    path.write_text("# my pins\npins: {}\n")
    images = records(tmp_path / "s.db", path).images
    images.record_wake(D1, ok=False, reason="MemAvailable fell under the floor")
    policy = images.policy()
    assert "cannot sleep and wake (MemAvailable fell under the floor" in policy.wake_refused(D1)
    assert policy.wake_refused(D2) is None
    images.record_wake(D1, ok=True)
    assert images.policy().wake_refused(D1) is None
    assert images.forget_wake(D1) and not images.policy().wakes and not images.forget_wake(D1)
    assert path.read_text() == "# my pins\npins: {}\n"


# The migration: an older sparkctl wrote its records into stacks/images.yaml itself.

def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(cwd), *args],
                   check=True, capture_output=True)


def _write(path: Path, data: dict) -> None:
    from ruamel.yaml import YAML

    with path.open("w") as out:
        YAML().dump(data, out)


def _old_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A state database as the version before the layers left it (its last migration: `DROP TABLE made`)."""
    with monkeypatch.context() as m:
        m.setattr(database, "MIGRATIONS", database.MIGRATIONS[:8])
        Store(path).close()


def test_a_checkouts_edited_images_yaml_is_imported_once_at_the_first_start(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout's tracked stacks/images.yaml, as an older version left it: a pin the owner made,
    the shipped pin settled by a first `up`, the shipped ban lifted by hand. Its first start at the
    new schema keeps all three (the file's differences from the commit), so the owner can restore
    the file (`git checkout`, `git pull`) without losing them; a later start imports nothing again."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    stacks = tmp_path / "checkout" / "stacks"
    stacks.mkdir(parents=True)
    shutil.copy(SHIPPED, stacks / "images.yaml")
    _git(stacks.parent, "init", "-q")
    _git(stacks.parent, "add", "stacks/images.yaml")
    _git(stacks.parent, "commit", "-qm", "shipped")
    edited = imagefile.load_policy(SHIPPED).model_dump(exclude_defaults=True)
    edited["pins"]["vllm/vllm-openai:v0.24.0"] = {"digest": D1, "provenance": "pinned by hand"}
    edited["pins"][V4]["digest"] = D2
    del edited["blacklist"][BANNED]
    _write(stacks / "images.yaml", edited)
    db = tmp_path / "state" / "sparkctl.db"
    _old_store(db, monkeypatch)

    policy = records(db, stacks / "images.yaml").images.policy()
    assert policy.pin_for("vllm/vllm-openai:v0.24.0").digest == D1 and policy.pin_for(V4).digest == D2
    assert policy.ban_for(BANNED) is None
    _git(stacks.parent, "checkout", "stacks/images.yaml")  # the owner restores the tracked file
    layered = records(db, stacks / "images.yaml").images.layered()
    assert layered.policy.pin_for("vllm/vllm-openai:v0.24.0").digest == D1 and layered.policy.pin_for(V4).digest == D2
    assert layered.policy.ban_for(BANNED) is None and layered.lifted() == [("blacklist", BANNED, Layer.SHIPPED)]
    assert layered.origin[("pins", "docker.io/vllm/vllm-openai:v0.24.0")] is Layer.STATE

    images = records(db, stacks / "images.yaml").images
    assert images.unpin("vllm/vllm-openai:v0.24.0")
    _write(stacks / "images.yaml", edited)  # edited again: read as the file it is, not imported again
    layered = records(db, stacks / "images.yaml").images.layered()
    assert layered.origin[("pins", "docker.io/vllm/vllm-openai:v0.24.0")] is Layer.SHIPPED
    (stacks / "images.yaml").unlink()
    _git(stacks.parent, "checkout", "stacks/images.yaml")
    assert records(db, stacks / "images.yaml").images.policy().pin_for("vllm/vllm-openai:v0.24.0") is None


def test_an_installed_packages_images_yaml_imports_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a git work tree (a package's data, an owner's own stacks dir) nothing tells what was
    written, and nothing needs to be: the upgrade replaced the package's file (its edits were gone
    before the new version ran), and an owner's own folder stays read as it is."""
    stacks = tmp_path / "site-packages" / "sparkctl" / "_data" / "stacks"
    stacks.mkdir(parents=True)
    (stacks / "images.yaml").write_text(SHIPPED.read_text() + f"  {D1}:\n    reason: mine\n")
    db = tmp_path / "state" / "sparkctl.db"
    _old_store(db, monkeypatch)
    images = records(db, stacks / "images.yaml").images
    assert not database.Database(db).all("SELECT * FROM image_policy")
    assert images.layered().origin[("blacklist", D1)] is Layer.SHIPPED
