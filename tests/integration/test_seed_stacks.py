"""Seed 003's month-stable Qwen setup redeploys from its stack file: the qwen36-v4 image pulled
from the loopback registry under its real name, the drafter from the local Hub, the sim profile
chosen from the speculative config, and the tag's digest (which nobody published) pinned by this
first deploy. Slow (one engine start): the unit tests cover the profile and the pin edit apart;
this checks that the pipeline does both on a real dockerd and registry."""

from __future__ import annotations

import datetime as dt

from tests.conftest import image_policy, name, port

V4 = "ghcr.io/aeon-7/vllm-aeon-ultimate-dflash:qwen36-v4"
GEMMA_V2 = "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2"


def test_qwen36_dflash_v4_deploys_on_its_profile_and_pins_its_first_digest(world, published, cli, engine) -> None:
    served = engine.client.images.get_registry_data(f"{published.host}/aeon-7/vllm-aeon-ultimate-dflash:qwen36-v4").id
    assert not image_policy(world).pin_for(V4).settled

    code, out, err = cli("up", "qwen36-dflash-v4")
    assert code == 0, err
    assert f"qwen36-dflash-v4 up: http://127.0.0.1:{port(8112)}/v1" in out and "speculative acceptance" in out
    assert f"pinned {V4} to {served}" in " ".join(out.split())  # the console wraps at 80 columns
    logs = engine.client.containers.get(name("qwen36-dflash-v4")).logs().decode()
    assert "sim profile qwen36-dflash-v4" in logs  # chosen from num_speculative_tokens 7

    pin = image_policy(world).pin_for(V4)
    assert (pin.digest, pin.known_good, pin.first_seen) == (served, False, dt.date.today())  # until a bench passes
    assert pin.provenance.startswith("seed 003:21,25") and "digest recorded at first deploy" in pin.provenance


def test_gemma4_without_speculation_runs_the_seeds_no_spec_profile_and_pins_v2(world, published, cli, engine) -> None:
    """Seed 003's 81 tok/s is Aeon Gemma-4 without speculation: its stack runs with no draft, on the
    sim profile of that figure, and its first deploy settles the v2 tag's pin."""
    served = engine.client.images.get_registry_data(f"{published.host}/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2").id
    code, out, err = cli("up", "aeon-gemma4-v2-nospec")
    assert code == 0, err
    assert f"pinned {GEMMA_V2} to {served}" in " ".join(out.split())
    container = engine.client.containers.get(name("aeon-gemma4-v2-nospec"))
    assert "sim profile aeon-gemma4-nospec" in container.logs().decode()
    args = container.attrs["Args"]
    assert "--speculative-config" not in args and "--enable-prefix-caching" in args
    pin = image_policy(world).pin_for(GEMMA_V2)
    assert (pin.digest, pin.known_good) == (served, False) and pin.provenance.startswith("seed 003:31,37")
