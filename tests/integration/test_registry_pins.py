"""`sparkctl image pin` asks a real registry for the digest, through the mirror map."""

from __future__ import annotations

import pytest

from tests.conftest import image_policy

GEMMA = "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash"


@pytest.fixture
def mirrored(workspace, own_registry, monkeypatch):
    monkeypatch.setenv("SPARKCTL_REGISTRY_MIRRORS", f"ghcr.io={own_registry.host}")
    return own_registry


def test_pin_resolves_the_digest_through_the_mirror(workspace, tiny_image, mirrored, cli) -> None:
    image = tiny_image("v2 build")
    digest = mirrored.push(image, "aeon-7/aeon-gemma-4-26b-a4b-dflash:v2")
    code, out, err = cli("image", "pin", f"{GEMMA}:v2", "--provenance", "test")
    assert (code, err) == (0, ""), err
    assert digest in out
    assert image_policy(workspace).pin_for(f"{GEMMA}:v2").digest == digest

    moved = mirrored.push(tiny_image("rebuilt"), "aeon-7/aeon-gemma-4-26b-a4b-dflash:v2")
    assert moved != digest
    code, out, _ = cli("image", "pin", f"{GEMMA}:v2")
    assert code == 0 and moved in out


def test_pin_refuses_a_blacklisted_tag(workspace, tiny_image, mirrored, cli) -> None:
    mirrored.push(tiny_image("broken"), "aeon-7/aeon-gemma-4-26b-a4b-dflash:latest")
    code, _, err = cli("image", "pin", f"{GEMMA}:latest")
    assert code == 1 and "blacklisted since 2026-06-10" in err


def test_unknown_tag_is_a_clear_error(workspace, mirrored, cli) -> None:
    code, _, err = cli("image", "pin", f"{GEMMA}:v999")
    assert code == 1 and err.startswith("error: resolve ") and "v999" in err and "Traceback" not in err
