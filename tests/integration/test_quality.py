"""The quality gate against a deployed stack (issue 49): a sim stack in its container, brought up by
`sparkctl up`, answering sparkctl's shipped task at 30 % (the `accuracy` fault in its stack file),
measured by lm-eval through the daemon's own gateway by its served name. What the sim tier's
test can't show: the image's engine answers the task, the daemon's route table carries lm-eval's
requests, and the run is stored with the parts the deploy pipeline recorded (the image's digest)."""

from __future__ import annotations

import pytest

from sparkctl.bench import quality
from sparkctl.settings import Settings
from sparkctl.spec.load import catalog_for
from sparkctl.state.store import Store

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
