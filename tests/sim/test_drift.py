"""Greedy drift through a real gateway (issue 49): sparkctl's fixed prompts at temperature 0, asked
by the `openai` client with an API key through a real gateway in front of the simulated engine,
whose greedy replies are fixed per prompt (and whose `drift_after` fault makes a build whose
replies change from token K on). A new build that answers the same is N of N identical; a
perturbed build is reported at the first prompt that diverged, at its token and character; a
speculative stack that drifts from its no-spec twin is a finding line; and the drift gate refuses
only a stack that asks for it. What the unit tests can't show: the request as the client sends
it, through the gateway's auth and routing, to an engine and back, stored and read again."""

from __future__ import annotations

import json

import pytest

from sparkctl.bench import drift
from sparkctl.errors import SparkctlError
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from sparkctl.phase import Phase
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store
from tests.conftest import Running

KEY = "sk-drift-secret-49"
MODEL = {"repo": "google/gemma-4", "revision": "main"}
BUILD_1 = {"image": "sha256:" + "a" * 64, "model": "c0ffee", "draft": "", "patches": "p1", "spec": "s1"}
BUILD_2 = BUILD_1 | {"image": "sha256:" + "b" * 64}
SPECULATIVE = ("--sim-profile", "qwen36-dflash-n8", "--speculative-config",
               json.dumps({"method": "mtp", "num_speculative_tokens": 4}))
pytestmark = pytest.mark.timeout(120)


def stack(name: str = "gemma", *, speculative: bool = False, **expect: object) -> Stack:
    vllm = {"port": 8110, "max_model_len": 2048, "served_model_name": "tiny"}
    if speculative:
        vllm["speculative"] = {"method": "mtp", "num_speculative_tokens": 4}
    return Stack.model_validate({"name": name, "image": {"repository": "ghcr.io/example/vllm", "tag": "v1"},
                                 "model": MODEL, "vllm": vllm, "expectations": {"drift": expect}})


@pytest.fixture
def served(sim, tmp_path):
    """`deploy(stack, parts, *sim_args, faults=...)`: a deployment of `stack` with `parts`
    running on a fresh sim behind a keyed gateway; returns the settings that reach it."""
    store = Store(tmp_path / "state.db")
    gateways: list[Running] = []

    def deploy(spec: Stack, parts: dict[str, str], *args: str, faults: str = "") -> Settings:
        for gateway in gateways:
            gateway.stop()
        deployment = store.deployments.begin(spec.name)
        store.deployments.set_fingerprint(deployment, f"fp-{deployment}", parts)
        store.deployments.advance(deployment, Phase.RUNNING)
        engine = sim(*(args or ("--sim-profile", "qwen36-nvfp4")), "--sim-seed", str(deployment), scale=0.01,
                     env={"SPARKCTL_SIM_FAULTS": faults})
        engine.wait_ready()
        table = RouteTable(upstreams={spec.name: Upstream(spec.name, engine.url, "tiny")}, aliases={})
        gateways.append(Running(Gateway(lambda: table, api_keys=[KEY])))
        return Settings(state_dir=tmp_path / "state", gateway_port=gateways[-1].port, gateway_api_keys=[KEY])

    yield deploy, store
    for gateway in gateways:
        gateway.stop()


def test_a_new_build_that_answers_the_same_is_n_of_n_identical(served) -> None:
    deploy, store = served
    first = drift.record_and_compare(stack(), settings=deploy(stack(), BUILD_1), store=store)
    assert first.build is None and first.lines == (
        "greedy outputs of 16 prompts stored (run 1): no earlier passing build of gemma on the same weights to "
        "compare with",)
    second = drift.record_and_compare(stack(), settings=deploy(stack(), BUILD_2), store=store)
    baseline, found = second.build
    assert (baseline.id, found.identical, found.total, found.first) == (1, 16, 16, None)
    assert second.lines == (f"greedy outputs against gemma's run 1 (image {'a' * 12} -> {'b' * 12}): 16 of 16 "
                            "identical",)
    run = store.greedy.run(second.run)
    assert (run.fingerprint, run.parts, run.model, run.speculative, run.verdict) == \
        ("fp-2", BUILD_2, "google/gemma-4", False, "pass")
    assert all(o.text and o.tokens and len(o.tokens) >= 12 for o in run.outputs)  # text and token ids came back


def test_a_perturbed_build_is_reported_at_the_first_prompt_and_token_that_diverged(served) -> None:
    deploy, store = served
    prompts = drift.Prompts(drift.shipped().texts[6:])
    drift.record_and_compare(stack(), settings=deploy(stack(), BUILD_1), store=store, prompts=prompts)
    settings = deploy(stack(), BUILD_2, faults="drift_after=30")
    found = drift.record_and_compare(stack(), settings=settings, store=store, prompts=prompts).build[1]
    before, after = store.greedy.run(1).outputs, store.greedy.run(2).outputs
    longer = [i for i, o in enumerate(before) if len(o.tokens) > 30]  # the sim's replies end at 12 to 40 tokens
    assert longer and longer[0] > 0  # the first prompts are too short to drift: the index is the one found
    assert (found.identical, found.total) == (10 - len(longer), 10)
    d = found.first
    assert (d.index, d.token) == (longer[0], 30)
    assert before[d.index].tokens[:30] == after[d.index].tokens[:30]
    ours, theirs = after[d.index].text, before[d.index].text
    assert ours[:d.char] == theirs[:d.char] and ours[d.char] != theirs[d.char] and d.char >= 30
    assert d.ours.startswith("…" + ours[d.char - drift.EXCERPT:d.char]) and d.theirs.startswith("…" + theirs[
        d.char - drift.EXCERPT:d.char])


def test_a_speculative_stack_is_compared_with_its_no_spec_twin(served) -> None:
    deploy, store = served
    drift.record_and_compare(stack(), settings=deploy(stack(), BUILD_1), store=store)
    spec = stack("gemma-mtp", speculative=True)
    same = drift.record_and_compare(spec, settings=deploy(spec, BUILD_1, *SPECULATIVE), store=store)
    assert same.lines[-1] == "identical to its no-spec twin gemma (run 1): 16 of 16 identical"
    drifted = drift.record_and_compare(spec, settings=deploy(spec, BUILD_2, *SPECULATIVE, faults="drift_after=20"),
                                       store=store)
    twin, found = drifted.twin
    assert (twin.stack, twin.id, found.first.token) == ("gemma", 1, 20) and found.identical < 16
    assert drifted.lines[-1].startswith(f"drifted from its no-spec twin gemma (run 1): {found.identical} of 16 "
                                        f"identical; prompt {found.first.index} first diverged at character ")
    assert drifted.lines[-1].endswith("speculative verification is lossless at temperature 0 against the same "
                                      "target, so this is a finding")
    assert drifted.verdict.passed and store.greedy.run(drifted.run).verdict == "pass"  # reported, not gated


def test_the_drift_gate_refuses_only_where_the_stack_asks(served) -> None:
    deploy, store = served
    drift.record_and_compare(stack(), settings=deploy(stack(), BUILD_1), store=store)
    gated = stack("gemma-mtp", speculative=True, gate=True, min_identical=0.9)
    passed = drift.record_and_compare(gated, settings=deploy(gated, BUILD_1, *SPECULATIVE), store=store)
    assert passed.verdict.passed  # identical to its twin: the gate lets it through
    with pytest.raises(drift.DriftFailed) as refused:
        drift.record_and_compare(gated, settings=deploy(gated, BUILD_1, *SPECULATIVE, faults="drift_after=5"),
                                 store=store)
    reason = ("0 of 16 greedy outputs identical to the no-spec twin gemma (run 1), under the 90% asked "
              "(expectations.drift.min_identical)")
    assert refused.value.verdict.reasons == (reason,)
    assert str(refused.value) == f"greedy drift gate: fail: {reason} (run 3)"
    assert store.greedy.run(3).verdict == f"fail: {reason} (run 3)"
    passing = store.greedy.passed(prompts=drift.shipped().key, model="google/gemma-4")
    assert [r.id for r in passing] == [2, 1]  # the refused run is no one's baseline


def test_a_keyless_ask_is_turned_away_and_stores_nothing(served) -> None:
    deploy, store = served
    settings = deploy(stack(), BUILD_1).model_copy(update={"gateway_api_keys": []})
    with pytest.raises(SparkctlError, match=r"greedy drift: the gateway refused a prompt for tiny at http://127\.0\."
                                            r"0\.1:\d+/v1: .*401"):
        drift.record_and_compare(stack(), settings=settings, store=store)
    assert store.greedy.runs("gemma") == []
