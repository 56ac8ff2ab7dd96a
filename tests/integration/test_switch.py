"""`sparkctl switch` through a real daemon, real dockerd and sim engines, with clients on the
gateway the whole time: 20 switches in each mode under an agent loop plus a 32-way loop, the
rollbacks (health, canary, crash while loading), and the hold timeout. Every request must
succeed and be answered by the stack the alias named while it was in flight."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from functools import partial
from pathlib import Path

import openai
import pytest

from sparkctl.state.store import Store
from tests.conftest import image_policy
from tests.integration.agents import FAST_LOAD, A, B, Load, amend, kill_during_switches, routed, switch, switch_quietly
from tests.integration.conftest import containers, wait_for


def primary_during(flips: list[tuple[float, float, str]], first: str, start: float, end: float) -> set[str]:
    """Every stack the alias may have named at some moment of [start, end], from the windows in
    which the switches flipped it."""
    named, current = set(), first
    for began, done, stack in sorted(flips):
        if done <= start:
            current = stack
        elif began <= end:
            named.add(current)
            current = stack
    return named | {current}


@pytest.mark.parametrize(("small", "mode"), [(True, "blue/green"), (False, "hold/swap")])
def test_twenty_switches_under_load_fail_no_request(switching, engine, small, mode) -> None:
    daemon = switching(small=small)
    with Load(daemon.gateway + "/v1") as load:
        load.served_by(A)
        for i in range(20):
            target = B if i % 2 == 0 else A
            seen = len(load.answers)
            outcome = switch(daemon, target)
            assert outcome["ok"], outcome.get("error")
            assert outcome["result"]["mode"] == mode
            load.served_by(target, since=seen)  # traffic on each stack between switches
    assert load.failures() == [], load.failures()[:3]
    records = daemon.client.get("/v1/history")["switches"]
    assert len(records) == 20 and all(r["ok"] for r in records)
    flips = [(*r["flipped"], r["to"]) for r in records]
    wrong = [a for a in load.answers if a.stack not in primary_during(flips, A, a.sent, a.received)]
    assert wrong == [], wrong[:3]
    assert {a.stack for a in load.answers} == {A, B}
    timings = records[0]["timings"]
    assert {"deploy_s", "engine_start_s", "health_s", "canary_s", "drain_s", "total_s"} <= set(timings)
    if mode == "hold/swap":
        assert "hold_s" in records[0] and sum(r["held_requests"] for r in records) > 0
    assert [c["Labels"]["sparkctl.stack"] for c in containers(engine)] == [A]


FAULTY = {  # the new stack fails its health checks, its canary, or crashes while loading
    "health": f"name: faulty\nextends: {B}\nhealth:\n  load: 1\ncontainer:\n  env:\n"
              "    SPARKCTL_SIM_FAULTS: hang_on_load\n",
    "canary": f"name: faulty\nextends: {B}\nexpectations:\n  min_acceptance: 0.99\n",
    "crash": f"name: faulty\nextends: {B}\ncontainer:\n  env:\n    SPARKCTL_SIM_FAULTS: crash_on_load\n",
}


@pytest.mark.parametrize("small", [True, False], ids=["blue-green", "hold-swap"])
@pytest.mark.parametrize("fault", sorted(FAULTY))
def test_a_failed_switch_rolls_back_without_failing_a_request(switching, engine, fault, small) -> None:
    daemon = switching(small=small, extra={"faulty": FAULTY[fault]})
    with Load(daemon.gateway + "/v1", width=8) as load:
        load.served_by(A)
        outcome = switch(daemon, "faulty")
        load.served_by(A, since=len(load.answers))  # and after the rollback
    assert not outcome["ok"] and "rolled back: primary still names qwen36-dflash" in outcome["error"]
    assert load.failures() == [], load.failures()[:3]
    assert {a.stack for a in load.answers} == {A}
    assert daemon.client.get("/v1/desired") == {"stacks": [A], "aliases": {"primary": A}, "fallbacks": {},
                                                "parked": {}, "routes": {}}
    assert [c["Labels"]["sparkctl.stack"] for c in containers(engine)] == [A]
    [record] = daemon.client.get("/v1/history")["switches"]
    assert record["ok"] is False and record["error"] == outcome["error"]


def test_a_request_held_past_the_timeout_gets_503_with_retry_after(switching, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_SWITCH_HOLD_TIMEOUT", "0.5")
    slow = f"name: slow\nextends: {B}\ncontainer:\n  env:\n    SPARKCTL_SIM_LOAD_SCALE: '0.02'\n"
    daemon = switching(small=False, extra={"slow": slow})
    worker = threading.Thread(target=switch, args=(daemon, "slow"))
    worker.start()
    wait_for(lambda: "switching" in json.loads(urllib.request.urlopen(daemon.gateway + "/health").read()),
             what="the hold")
    models = json.loads(urllib.request.urlopen(daemon.gateway + "/v1/models").read())["data"]
    assert models[0]["id"] == "primary" and models[0]["switching"]["to"] == "slow"
    agent = openai.OpenAI(base_url=daemon.gateway + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.InternalServerError) as held:
        agent.completions.create(model="primary", prompt="x", max_tokens=4)
    assert held.value.status_code == 503 and held.value.response.headers["Retry-After"] == "5"
    assert held.value.body["source"] == "sparkctl" and held.value.body["code"] == "switch_in_progress"
    worker.join(60)
    assert json.loads(urllib.request.urlopen(daemon.gateway + "/health").read())["status"] == "ok"
    reply = agent.completions.create(model="primary", prompt="x", max_tokens=4)
    assert reply.model == "aeon-gemma4"


def switched_cleanly(daemon, engine) -> bool:
    """desired.yaml names one stack, the alias names it, it alone runs and the gateway routes to it."""
    desired = daemon.client.get("/v1/desired")
    stack = desired["aliases"].get("primary")
    states = [(c["Labels"]["sparkctl.stack"], c["State"]) for c in containers(engine)]
    return desired["stacks"] == [stack] and states == [(stack, "running")] and routed(daemon.gateway) == stack


def test_kill9_at_random_points_of_switches_settles(switching, start_daemon, engine, world) -> None:
    kill_during_switches(switching(small=False), start_daemon, points=10, seed=20261130, within=1.5,
                         settled=partial(switched_cleanly, engine=engine))
    store = Store(world / "state" / "sparkctl.db")
    assert store.integrity_ok() and store.switches.list(unfinished=True) == []
    assert 0 < len(store.switches.list()) <= 10  # a kill can come before the daemon took the request


def test_after_a_kill9_mid_swap_the_old_stack_serves_again_at_once(switching, start_daemon, engine,
                                                                    monkeypatch) -> None:
    """The daemon dies after a hold/swap stopped the old stack: the restarted daemon undoes the
    switch and starts the old stack at once, not at the next resync (30 s here, as by default)."""
    monkeypatch.setenv("SPARKCTL_RESYNC_INTERVAL", "30")
    daemon = switching(small=False)
    [old] = containers(engine, A)
    worker = threading.Thread(target=switch_quietly, args=(daemon, B))
    worker.start()
    wait_for(lambda: engine.inspect(old["Id"]).status == "exited", timeout=60, what="the old stack stopped")
    daemon.kill9()
    worker.join(60)
    assert not worker.is_alive(), "the switch's client did not return after its daemon was killed"
    started = time.monotonic()
    daemon = start_daemon()
    daemon.gateway = f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"
    wait_for(partial(switched_cleanly, daemon, engine), timeout=25, what="serving again", logs=daemon.logs)
    assert routed(daemon.gateway) in (A, B) and time.monotonic() - started < 20


def test_switching_to_the_stack_the_alias_names_is_a_no_op(switching, cli, engine) -> None:
    switching(small=True)
    [before] = containers(engine, A)
    code, out, err = cli("switch", "primary", A)
    assert code == 0 and f"primary already names {A}: nothing to switch ({A} already up, unchanged)" in out, err
    assert [c["Id"] for c in containers(engine)] == [before["Id"]]


def test_a_planned_restart_loses_no_request(world, start_daemon, monkeypatch) -> None:
    """`systemctl restart` with the installed units: systemd holds the gateway's socket, the old
    daemon finishes what it accepted, agents that connect meanwhile wait in the socket's queue."""
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", FAST_LOAD)
    amend(world / "stacks" / f"{A}.yaml", switch={"bench": "off"})
    (world / "state").mkdir(exist_ok=True)
    (world / "state" / "desired.yaml").write_text(f"stacks: [{A}]\naliases: {{primary: {A}}}\n")
    with socket.create_server(("127.0.0.1", int(os.environ["SPARKCTL_GATEWAY_PORT"])), backlog=4096) as listener:
        gateway = f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"
        daemon = start_daemon(listener)
        wait_for(lambda: routed(gateway) == A, timeout=60, what="primary routed", logs=daemon.logs)
        with Load(gateway + "/v1", width=8) as load:
            load.served_by(A)
            stopped = time.time()
            daemon.stop()  # SIGTERM, as systemd sends it; returns once the process exited
            daemon = start_daemon(listener)
            wait_for(lambda: routed(gateway) == A, timeout=60, what="serving again", logs=daemon.logs)
            load.served_by(A, since=len(load.answers))  # the new daemon answers each loop
    assert load.failures() == [], load.failures()[:3]
    waited = max(a.received - a.sent for a in load.answers if a.sent >= stopped - 0.5)
    print(f"longest wait across the restart: {waited:.2f} s over {len(load.answers)} answers")


@pytest.mark.parametrize("when", ["gate", "after"])
def test_the_switch_over_benchmark_runs_as_a_gate_or_after_release(switching, world, when) -> None:
    daemon = switching(small=False)
    amend(world / "stacks" / f"{B}.yaml", switch={"bench": when})
    with Load(daemon.gateway + "/v1", width=4) as load:
        outcome = switch(daemon, B)
    assert outcome["ok"] and load.failures() == []
    bench = outcome["result"]["bench"]
    assert bench.get("verdict") == "pass" and "tok/s at depth 16384" in bench["summary"], bench
    run = Store(world / "state" / "sparkctl.db").bench.run(bench["run"])
    assert run.stack == B and run.profile == "quick" and [r["depth"] for r in run.rows] == [0, 4096, 16384]
    assert run.parts["image"].startswith("sha256:") and (Path(run.folder) / "llama-benchy.json").exists()
    assert ("bench_s" in outcome["result"]["timings"]) is (when == "gate")


def test_a_failed_benchmark_gate_rolls_the_switch_back(switching, world) -> None:
    daemon = switching(small=True)
    amend(world / "stacks" / f"{B}.yaml", switch={"bench": "gate"},
          expectations={"min_decode_tps": 1e9, "min_acceptance": 0.4})
    with Load(daemon.gateway + "/v1", width=4) as load:
        outcome = switch(daemon, B)
    assert not outcome["ok"] and "Cause: benchmark gate: fail: decode" in outcome["error"]
    assert "blacklisted image sha256:" in outcome["error"]  # its digest never passed a gate
    assert load.failures() == [] and {a.stack for a in load.answers} == {A}
    assert daemon.client.get("/v1/desired")["aliases"] == {"primary": A}


def test_a_new_tag_that_measures_badly_is_rolled_back_and_its_digest_blacklisted(switching, world, published,
                                                                                 images, cli, engine) -> None:
    digest = published.push(images["sim"], "aeon-7/aeon-gemma-4-26b-a4b-dflash:next",
                            env={"SPARKCTL_SIM_PROFILE": "aeon-gemma4-latest-broken"},
                            labels={"sparkctl.rebuild": "next"})
    nxt = f"name: gemma-next\nextends: {B}\nimage:\n  tag: next\nswitch:\n  bench: gate\n"
    daemon = switching(small=False, extra={"gemma-next": nxt})
    with Load(daemon.gateway + "/v1", width=8) as load:
        outcome = switch(daemon, "gemma-next")
    assert not outcome["ok"] and f"blacklisted image {digest}" in outcome["error"]
    assert "acceptance" in outcome["error"] and "under the stack's floor 0.40" in outcome["error"]
    assert load.failures() == [] and {a.stack for a in load.answers} == {A}
    assert daemon.client.get("/v1/desired")["aliases"] == {"primary": A}
    ban = image_policy(world).blacklist[digest]
    assert ban.reason.startswith("ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:next: canary speculative acceptance")
    code, _, err = cli("up", "gemma-next", "--replace")
    assert code == 1 and "blacklisted" in err
    assert [c["State"] for c in containers(engine, A)] == ["running"]  # a refused image stops nothing
    assert daemon.client.get("/v1/desired")["stacks"] == [A]  # refused for good: not kept desired
    assert cli("bench", "run", A, "--profile", "quick", "--depths", "0")[0] == 0
    code, out, _ = cli("bench", "report", A, "--out", str(world / "report"))
    assert code == 0 and f"`{digest}`: ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:next: canary speculative " \
        "acceptance" in (world / "report" / "comparison.md").read_text()
    assert cli("image", "unblacklist", digest)[0] == 0
