"""The quality gate through the real lm-eval client (issue 49): lm-eval 0.4.13 asks sparkctl's
shipped task through a real gateway with an API key, in front of the simulated engine answering
at a set accuracy (the `accuracy` fault); the run is stored with the deployment's parts and
judged. 90 % passes a 70 % floor; 30 % is refused with the measured accuracy; a fall of more
than `max_drop` under the stack's last passing run is refused; and nothing of lm-eval's tries to
leave the machine (every HTTP proxy variable points at a recorder that must stay unvisited).
What the unit tests can't show: lm-eval's own request, template, filter and scoring, end to end."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from sparkctl.bench import quality
from sparkctl.errors import SparkctlError
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from sparkctl.phase import Phase
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.state.store import Store
from tests.conftest import Running

KEY = "sk-quality-secret-49"
PARTS = {"image": "sha256:" + "a" * 64, "model": "c0ffee", "draft": "", "patches": "p1", "spec": "s1"}
pytestmark = pytest.mark.timeout(240)  # up to three lm-eval runs of 200 items, a few seconds each


def stack(**quality: object) -> Stack:
    return Stack.model_validate({
        "name": "gemma", "image": {"repository": "ghcr.io/example/vllm", "tag": "v1"},
        "model": {"repo": "google/gemma-4", "revision": "main"},
        "vllm": {"port": 8110, "max_model_len": 2048, "served_model_name": "tiny"},
        "expectations": {"quality": quality}})


class Recorder:
    """A listener that only counts who connects: the proxy every HTTP client is pointed at."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.visits = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.visits += 1
            conn.close()


@pytest.fixture
def served(sim, tmp_path, monkeypatch):
    """`start(accuracy)`: the sim at that accuracy behind a keyed gateway, and the settings and
    store of a sparkctl whose `gemma` stack is running there."""
    recorder = Recorder()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(name, recorder.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    gateways: list[Running] = []
    store = Store(tmp_path / "state.db")
    deployment = store.deployments.begin("gemma")
    store.deployments.set_fingerprint(deployment, "fp-1", PARTS)
    store.deployments.advance(deployment, Phase.RUNNING)

    def start(accuracy: float) -> Settings:
        for gateway in gateways:
            gateway.stop()
        engine = sim("--sim-profile", "qwen36-nvfp4", scale=0.01, env={"SPARKCTL_SIM_FAULTS": f"accuracy={accuracy}"})
        engine.wait_ready()
        table = RouteTable(upstreams={"gemma": Upstream("gemma", engine.url, "tiny")}, aliases={})
        gateways.append(Running(Gateway(lambda: table, api_keys=[KEY])))
        return Settings(state_dir=tmp_path / "state", gateway_port=gateways[-1].port, gateway_api_keys=[KEY])

    yield start, store
    for gateway in gateways:
        gateway.stop()
    assert recorder.visits == 0, "lm-eval tried to reach beyond the machine"


def test_ninety_percent_passes_a_seventy_percent_floor_and_is_stored_with_its_deployment(served) -> None:
    start, store = served
    settings = start(0.9)
    run, verdict = quality.assess(stack(floor=0.7), settings=settings, store=store)
    assert verdict.passed, verdict.reasons
    assert 0.85 <= run.accuracy <= 0.95 and run.items == 200 and run.tool == "lm-eval 0.4.13"
    assert 0 < run.stderr < 0.05
    assert (run.fingerprint, run.parts, run.verdict) == ("fp-1", PARTS, "pass")
    assert store.quality.last_pass("gemma", task="sparkctl_arith", items=200) == store.quality.run(run.id)
    folder = Path(run.folder)
    assert folder == settings.state_dir / "quality" / str(run.id)
    assert len((folder / "samples.jsonl").read_text().splitlines()) == 200
    assert KEY not in (folder / "command.txt").read_text()


def test_thirty_percent_is_refused_naming_the_measured_accuracy(served) -> None:
    start, store = served
    run, verdict = quality.assess(stack(floor=0.7), settings=start(0.3), store=store)
    assert not verdict.passed
    measured = f"{run.accuracy * 100:.1f}%"
    assert 0.25 <= run.accuracy <= 0.35
    assert verdict.reasons == (f"sparkctl_arith accuracy {measured} ± {run.stderr * 100:.1f}% over 200 items "
                               "(lm-eval 0.4.13) < 70.0% floor",)
    assert store.quality.run(run.id).verdict.startswith(f"fail: sparkctl_arith accuracy {measured}")
    assert store.quality.last_pass("gemma", task="sparkctl_arith", items=200) is None


def test_a_drop_past_max_drop_against_the_last_passing_run_is_refused(served) -> None:
    start, store = served
    gate = stack(floor=0.5, max_drop=0.05, items=100)
    first, verdict = quality.assess(gate, settings=start(0.9), store=store)
    assert verdict.passed, verdict.reasons
    second, verdict = quality.assess(gate, settings=start(0.75), store=store)
    assert second.accuracy >= 0.5  # over the floor: the drop alone refuses it
    drop = round((first.accuracy - second.accuracy) * 100, 6)
    assert drop > 5
    assert verdict.reasons == (f"sparkctl_arith accuracy {second.accuracy * 100:.1f}% ± {second.stderr * 100:.1f}% "
                               f"over 100 items (lm-eval 0.4.13) is {drop:g} points under last passing quality run "
                               f"{first.id} ({first.accuracy * 100:.1f}%); at most 5 allowed",)
    assert store.quality.last_pass("gemma", task="sparkctl_arith", items=100).id == first.id


def test_a_keyless_lm_eval_is_turned_away_and_the_run_keeps_why(served, monkeypatch) -> None:
    start, store = served
    settings = start(0.9).model_copy(update={"gateway_api_keys": []})
    with pytest.raises(SparkctlError, match="the endpoint refused lm-eval's requests: .*401"):
        quality.assess(stack(floor=0.7, items=5), settings=settings, store=store)
    (failed,) = store.quality.runs("gemma")
    assert failed.accuracy is None and "401" in failed.error
