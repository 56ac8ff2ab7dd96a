"""Greedy drift in front of each engine kind (issue 49), through the gateway with the `openai`
client: the simulated engine and real vLLM (CPU, the tiny model's random weights) answer
sparkctl's fixed prompts at temperature 0 with their token ids, and a second build on the same
engine is 16 of 16 identical. What the sim tier can't show: the request (temperature 0, `seed`,
`return_token_ids`) as real vLLM takes it, and its greedy decoding as deterministic as the
comparison assumes, 4 prompts at once."""

from __future__ import annotations

import pytest

from sparkctl.bench import drift
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from sparkctl.phase import Phase
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store
from tests.conftest import Running

BUILD = {"image": "sha256:" + "a" * 64, "model": "c0ffee", "draft": "", "patches": "", "spec": "s1"}


@pytest.mark.timeout(600)
def test_a_second_build_on_the_same_engine_is_16_of_16_identical(served, tmp_path) -> None:
    table = RouteTable(upstreams={"stack": Upstream("stack", served.url, "tiny")}, aliases={})
    gateway = Running(Gateway(lambda: table))
    store = Store(tmp_path / "state.db")
    stack = Stack.model_validate({
        "name": "stack", "image": {"repository": "ghcr.io/example/vllm", "tag": "v1"},
        "model": {"repo": "example/tiny", "revision": "main"}, "vllm": {"served_model_name": "tiny"}})
    settings = Settings(state_dir=tmp_path, gateway_port=gateway.port)
    found = []
    try:
        for image in ("a", "b"):
            deployment = store.deployments.begin("stack")
            store.deployments.set_fingerprint(deployment, f"fp-{image}", BUILD | {"image": "sha256:" + image * 64})
            store.deployments.advance(deployment, Phase.RUNNING)
            found.append(drift.record_and_compare(stack, settings=settings, store=store))
    finally:
        gateway.stop()
    baseline, compared = found[1].build
    assert baseline.id == found[0].run and (compared.identical, compared.total) == (16, 16), compared.describe()
    outputs = store.greedy.run(found[1].run).outputs
    assert all(o.text and o.tokens for o in outputs)  # text and token ids from either engine
    assert len({o.text for o in outputs}) > 1  # each prompt its own reply
