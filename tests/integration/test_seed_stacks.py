"""Seed 003's month-stable Qwen setup redeploys from its stack file: the qwen36-v4 image pulled
from the loopback registry under its real name, the drafter from the local Hub, the sim profile
chosen from the speculative config, and the tag's digest (which nobody published) pinned by this
first deploy. Slow (one engine start): the unit tests cover the profile and the pin edit apart;
this checks that the pipeline does both on a real dockerd and registry."""

from __future__ import annotations

import datetime as dt

from tests.conftest import image_policy, name, port

V4 = "ghcr.io/aeon-7/vllm-aeon-ultimate-dflash:qwen36-v4"


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
