"""`sparkctl image retest` on the loopback registry, with the shipped ban on the Gemma `latest`
tag: while `latest` is the broken sim image the retest fails (the ban stays, the measurement is
appended to it), and once the tag has moved to a good image it passes (the ban is lifted and the
tag pinned known-good with the run as provenance). The failing retest runs in the CLI's process,
the passing one through the daemon, whose reconcile passes must leave the trial alone. Each
trial is a real deploy (registry, pull by digest, the Hub, the sim engine) and a real
llama-benchy run: what the unit tests of the policy and the gate cannot show."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from sparkctl.state.store import Store
from tests.conftest import image_policy, ours
from tests.integration.agents import amend

GEMMA = "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash"
LATEST = "aeon-7/aeon-gemma-4-26b-a4b-dflash:latest"
BROKEN = {"SPARKCTL_SIM_PROFILE": "aeon-gemma4-latest-broken"}
# Fast loads; requests slow enough (~0.15 s each) that a burst of 32 overlaps past the broken
# image's 16 even on a loaded machine.
ENGINE_ENV = "SPARKCTL_SIM_TIME_SCALE=0.05,SPARKCTL_SIM_LOAD_SCALE=0.002"


@pytest.fixture
def broken_latest(world, published, images, monkeypatch):
    """`latest` on the registry is the broken sim image (as published), and is again afterwards."""
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", ENGINE_ENV)
    yield published.push(images["sim"], LATEST, env=BROKEN)
    published.push(images["sim"], LATEST, env=BROKEN)


def test_a_retest_keeps_the_ban_until_the_tag_moves_to_a_good_image(world, broken_latest, published, images, cli,
                                                                    engine, start_daemon) -> None:
    code, out, err = cli("image", "retest", f"{GEMMA}:latest")
    assert code == 1, out + err
    assert "still fails aeon-gemma4-v2's gate: acceptance 0." in err and "< 0.40 floor" in err
    assert "requests failed at concurrency 32, 64" in err and "the ban stays" in err
    assert "benchmark: depth 0, 64 concurrent request(s)" in out  # past the failure point
    ban = image_policy(world).blacklist[f"{GEMMA}:latest"]
    assert ban.date.isoformat() == "2026-06-10" and "use v2" in ban.reason  # the shipped ban, kept as it was
    [measured] = ban.retests
    assert measured.digest == broken_latest and measured.verdict.startswith("fail: ")
    store = Store(world / "state" / "sparkctl.db")
    run = store.bench.run(measured.run)
    assert run.stack == "aeon-gemma4-v2.retest" and run.parts["image"] == broken_latest
    assert any(r["failed"] for r in run.rows if r["concurrency"] > 16)  # the broken image fell over under load
    assert ours(engine) == []  # the trial is removed, pass or fail

    code, _, err = cli("image", "retest", f"{GEMMA}:latest")  # the tag has not moved: nothing new to measure
    assert code == 1 and "nothing changed" in err and "--force" in err

    fixed = published.move_tag(LATEST, images["sim"], stamp="fixed")
    assert cli("daemon", "--stop")[0] == 0  # the one the first command started: this one's log is read below
    daemon = start_daemon()
    code, out, err = cli("image", "retest", f"{GEMMA}:latest")
    assert code == 0, out + err + daemon.logs()[-3000:]
    assert f"{GEMMA}:latest re-qualified" in out and fixed in out
    policy = image_policy(world)
    assert policy.ban_for(f"{GEMMA}:latest", fixed) is None
    pin = policy.pin_for(f"{GEMMA}:latest")
    assert (pin.digest, pin.known_good) == (fixed, True)
    passed = store.bench.runs("aeon-gemma4-v2.retest")[0]
    assert f"benchmark run {passed.id} passed its gate" in pin.provenance and passed.verdict == "pass"
    assert ours(engine) == [] and daemon.client.get("/v1/desired")["stacks"] == []
    assert "container_removed" not in daemon.logs()  # no reconcile pass took the trial away


def test_a_retest_of_a_stack_with_a_quality_gate_measures_quality_too(world, broken_latest, published, images, cli,
                                                                      engine) -> None:
    """`expectations.quality` set: the trial's accuracy is measured at its engine beside its
    benchmark, and both gates must pass. An image fast enough but answering at 30 % keeps its ban,
    with the quality run in the measurement; one answering at 90 % is re-qualified by both runs."""
    path = world / "stacks" / "aeon-gemma4-v2.yaml"
    expectations = dict(YAML().load(path.read_text())["expectations"])
    amend(path, expectations={**expectations, "quality": {"floor": 0.7, "items": 50}})
    wrong = published.push(images["sim"], LATEST, env={"SPARKCTL_SIM_FAULTS": "accuracy=0.3"})
    code, out, err = cli("image", "retest", f"{GEMMA}:latest")
    assert code == 1, out + err
    store = Store(world / "state" / "sparkctl.db")
    checked = store.quality.runs("aeon-gemma4-v2.retest")[0]
    assert checked.parts["image"] == wrong and 0.15 <= checked.accuracy <= 0.45
    assert f"quality run {checked.id}: sparkctl_arith {checked.accuracy * 100:.1f}%" in out
    assert f"< 70.0% floor (quality run {checked.id})" in " ".join(err.split()) and "the ban stays" in err
    measured = image_policy(world).blacklist[f"{GEMMA}:latest"].retests[-1]
    assert measured.digest == wrong and measured.verdict.startswith("fail: sparkctl_arith accuracy")
    assert store.bench.run(measured.run).verdict == "pass"  # fast enough: the quality gate kept the ban
    assert ours(engine) == []

    right = published.push(images["sim"], LATEST, env={"SPARKCTL_SIM_FAULTS": "accuracy=0.9"})
    code, out, err = cli("image", "retest", f"{GEMMA}:latest")
    assert code == 0, out + err
    passed = store.quality.runs("aeon-gemma4-v2.retest")[0]
    assert passed.parts["image"] == right and passed.verdict == "pass"
    pin = image_policy(world).pin_for(f"{GEMMA}:latest")
    assert pin.digest == right and f"and quality run {passed.id} passed its quality gate" in pin.provenance
