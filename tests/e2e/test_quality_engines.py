"""The quality gate in front of each engine kind (issue 49), through the gateway with lm-eval 0.4.13:
the simulated engine (its profile's accuracy, 0.95) passes a 70 % floor; real vLLM (CPU) serving
the tiny model's random weights answers in words no number comes out of, and is refused with a
message that says no answer was right. What the sim tier can't show: lm-eval's requests as real
vLLM takes them (its chat template, stop list, seed), and the refusal a broken model gets."""

from __future__ import annotations

import pytest

from sparkctl.bench import quality
from sparkctl.bench.gate import GateFailed
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from sparkctl.phase import Phase
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store
from tests.conftest import Running

ITEMS = 10  # real vLLM on two CPU cores writes up to 256 tokens for each


@pytest.mark.timeout(600)
def test_the_quality_gate_passes_the_sim_and_refuses_random_weights(served, tmp_path) -> None:
    table = RouteTable(upstreams={"stack": Upstream("stack", served.url, "tiny")}, aliases={})
    gateway = Running(Gateway(lambda: table))
    store = Store(tmp_path / "state.db")
    deployment = store.deployments.begin("stack")
    store.deployments.advance(deployment, Phase.RUNNING)
    stack = Stack.model_validate({
        "name": "stack", "image": {"repository": "ghcr.io/example/vllm", "tag": "v1"},
        "model": {"repo": "example/tiny", "revision": "main"}, "vllm": {"served_model_name": "tiny"},
        "expectations": {"quality": {"floor": 0.7, "items": ITEMS}}})
    try:
        run, verdict = quality.assess(stack, settings=Settings(state_dir=tmp_path, gateway_port=gateway.port),
                                      store=store)
    finally:
        gateway.stop()
    assert run.items == ITEMS and run.tool == "lm-eval 0.4.13"
    if served.kind == "sim":
        assert verdict.passed and run.accuracy >= 0.8, verdict.reasons
    else:
        assert run.accuracy == 0
        assert verdict.reasons == (f"sparkctl_arith accuracy 0.0% over {ITEMS} items (lm-eval 0.4.13) < 70.0% floor",
                                   "no answer was right: the model answers, but wrongly or in no readable form "
                                   "(random weights, a broken image, patch, quantization or draft)")
        # what a switch's rollback gives as its cause (`Cause: ...`), and blacklists the digest for
        assert str(GateFailed(verdict)) == f"quality gate: fail: {'; '.join(verdict.reasons)} (quality run {run.id})"
