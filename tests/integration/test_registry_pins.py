"""`sparkctl image pin` asks a real registry for the digest, through the mirror map; the daemon
makes every edit of images.yaml, never the CLI's process."""

from __future__ import annotations

import pytest

from sparkctl.cli.client import DaemonClient
from sparkctl.state.images import ImageRecords
from tests.conftest import image_policy

GEMMA = "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash"


@pytest.fixture
def mirrored(workspace, own_registry, monkeypatch):
    monkeypatch.setenv("SPARKCTL_REGISTRY_MIRRORS", f"ghcr.io={own_registry.host}")
    return own_registry


def test_pin_resolves_the_digest_through_the_mirror(workspace, tiny_image, mirrored, cli, monkeypatch) -> None:
    """The daemon (a process of its own) resolves and pins: this process, the CLI's, cannot record
    into the image policy's state here, and every edit still lands, concurrent ones too."""
    from concurrent.futures import ThreadPoolExecutor

    def refused(*_: object) -> None:
        raise AssertionError("the CLI's process recorded into the image policy")

    monkeypatch.setattr(ImageRecords, "_put", refused)
    image = tiny_image("v2 build")
    digest = mirrored.push(image, "aeon-7/aeon-gemma-4-26b-a4b-dflash:v2")
    code, out, err = cli("image", "pin", f"{GEMMA}:v2", "--provenance", "test")
    assert code == 0 and "error" not in err, err
    assert digest in out
    assert image_policy(workspace).pin_for(f"{GEMMA}:v2").digest == digest

    moved = mirrored.push(tiny_image("rebuilt"), "aeon-7/aeon-gemma-4-26b-a4b-dflash:v2")
    assert moved != digest
    code, out, _ = cli("image", "pin", f"{GEMMA}:v2")
    assert code == 0 and moved in out

    client, bans = DaemonClient(workspace / "state" / "sparkctl.sock"), [f"sha256:{n:064x}" for n in range(8)]
    with ThreadPoolExecutor(8) as pool:  # the daemon's edits at once: none lost to another
        list(pool.map(lambda ban: client.post("/v1/image", {"edit": "blacklist", "ref": ban, "reason": "t"}), bans))
    policy = image_policy(workspace)
    assert set(bans) <= set(policy.blacklist) and policy.pin_for(f"{GEMMA}:v2").digest == moved


def test_pin_refuses_a_blacklisted_tag(workspace, tiny_image, mirrored, cli) -> None:
    mirrored.push(tiny_image("broken"), "aeon-7/aeon-gemma-4-26b-a4b-dflash:latest")
    code, _, err = cli("image", "pin", f"{GEMMA}:latest")
    assert code == 1 and "blacklisted since 2026-06-10" in err


def test_unknown_tag_is_a_clear_error(workspace, mirrored, cli) -> None:
    code, _, err = cli("image", "pin", f"{GEMMA}:v999")
    assert code == 1 and err.splitlines()[-1].startswith("error: resolve ") and "v999" in err and "Traceback" not in err
