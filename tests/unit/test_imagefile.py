"""Editing images.yaml keeps its comments and order, and refuses to write a bad file."""

from __future__ import annotations

from pathlib import Path

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
    assert imagefile.load_policy(path).pins == {}
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
