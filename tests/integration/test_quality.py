"""The quality gate against a deployed stack (issue 49): a sim stack in its container, brought up by
`sparkctl up`, answering sparkctl's shipped task at 30 % (the `accuracy` fault in its stack file),
measured by lm-eval through the daemon's own gateway by its served name. What the sim tier's
test can't show: the image's engine answers the task, the daemon's route table carries lm-eval's
requests, and the run is stored with the parts the deploy pipeline recorded (the image's digest)."""

from __future__ import annotations

import pytest
from ruamel.yaml import YAML

from sparkctl.bench import quality
from sparkctl.settings import Settings
from sparkctl.spec.load import catalog_for
from sparkctl.state.store import Store
from tests.conftest import image_policy
from tests.integration.agents import A, B, Load, amend, switch

STACK = """\
name: wrong
extends: qwen36-nvfp4-stock
container:
  env:
    SPARKCTL_SIM_FAULTS: accuracy=0.3
expectations:
  quality:
    floor: 0.7
    items: 50
"""


@pytest.mark.timeout(400)
def test_a_deployed_stack_answering_wrongly_is_refused_through_the_daemons_gateway(world, cli, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", "SPARKCTL_SIM_TIME_SCALE=0.05,SPARKCTL_SIM_LOAD_SCALE=0.002")
    (world / "stacks" / "wrong.yaml").write_text(STACK)
    code, _, err = cli("up", "wrong")
    assert code == 0, err
    settings = Settings()
    store = Store(settings.store_path)
    run, verdict = quality.assess(catalog_for(settings).stack("wrong"), settings=settings, store=store)
    assert not verdict.passed
    assert 0.15 <= run.accuracy <= 0.45 and run.items == 50
    assert verdict.reasons == (f"sparkctl_arith accuracy {run.accuracy * 100:.1f}% ± {run.stderr * 100:.1f}% over "
                               "50 items (lm-eval 0.4.13) < 70.0% floor",)
    deployment = store.deployments.latest("wrong")
    assert (run.fingerprint, run.parts) == (deployment.fingerprint, deployment.parts)
    assert run.parts["image"].startswith("sha256:") and run.verdict.startswith("fail: ")


def answering_at(world, accuracy: float) -> None:
    """B switched to with its gate and a quality floor of 70 % over 50 items, answering at `accuracy`."""
    path = world / "stacks" / f"{B}.yaml"
    data = YAML().load(path.read_text())
    amend(path, switch={**data["switch"], "bench": "gate"},
          container={**data["container"], "env": {"SPARKCTL_SIM_FAULTS": f"accuracy={accuracy}"}},
          expectations={**data["expectations"], "quality": {"floor": 0.7, "items": 50}})


@pytest.mark.timeout(600)
def test_a_switch_to_a_stack_that_answers_wrongly_is_rolled_back_and_its_digest_blacklisted(switching, world,
                                                                                            cli) -> None:
    """The quality gate beside the speed gate in `switch.bench: gate`: at 30 % the switch is rolled
    back with no request of a client failing, the digest blacklisted with the measured accuracy;
    unbanned and answering at 90 %, the same switch passes and its digest becomes known-good."""
    daemon = switching(small=False)
    answering_at(world, 0.3)
    with Load(daemon.gateway + "/v1", width=4) as load:
        outcome = switch(daemon, B)
    assert not outcome["ok"] and "Cause: quality gate: fail: sparkctl_arith accuracy 3" in outcome["error"]
    assert load.failures() == [] and {a.stack for a in load.answers} == {A}
    assert daemon.client.get("/v1/desired")["aliases"] == {"primary": A}
    store = Store(world / "state" / "sparkctl.db")
    failed = store.quality.runs(B)[0]
    assert 0.15 <= failed.accuracy <= 0.45 and failed.items == 50
    assert failed.verdict.endswith(f"(quality run {failed.id})")
    digest = failed.parts["image"]
    reason = image_policy(world).blacklist[digest].reason
    assert reason.startswith(f"ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2: sparkctl_arith accuracy "
                             f"{failed.accuracy * 100:.1f}% ± ") and reason.endswith(f"(quality run {failed.id})")
    assert f"blacklisted image {digest}" in outcome["error"]
    assert store.bench.known_good(B) is None  # its benchmark passed, but the quality gate did not

    assert cli("image", "unblacklist", digest)[0] == 0
    answering_at(world, 0.9)
    with Load(daemon.gateway + "/v1", width=4) as load:
        outcome = switch(daemon, B)
    assert outcome["ok"] and load.failures() == [], outcome
    passed = store.quality.run(outcome["result"]["bench"]["quality"]["run"])
    assert passed.verdict == "pass" and 0.8 <= passed.accuracy <= 1.0
    assert f"quality run {passed.id}: sparkctl_arith {passed.accuracy * 100:.1f}% (95% CI " \
        in outcome["result"]["bench"]["summary"]
    assert store.bench.known_good(B).parts["image"] == digest
    assert daemon.client.get("/v1/desired")["aliases"] == {"primary": B}
