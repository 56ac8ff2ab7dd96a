"""GB10's sleep rules through a real daemon, real dockerd and sim engines (issue 46, part 2): a
stack whose wake would re-map a KV region over the bound runs as the seeds ran it (no sleep mode,
no dev endpoints) and leaves an alias by stopping; and by default only one engine sleeps at a
time. The mechanics of sleeping and waking are test_parking.py's."""

from __future__ import annotations

from tests.integration.agents import A, B, switch
from tests.integration.conftest import containers

SPARK = {"SPARKCTL_MEMORY_TOTAL_GIB": "119", "SPARKCTL_PARK_RESIDUE_GIB": "2"}  # fractions as on a GB10


def command_and_env(engine, stack: str) -> tuple[list[str], list[str]]:
    [c] = [c for c in containers(engine, stack) if c["State"] == "running"]
    config = engine.client.api.inspect_container(c["Id"])["Config"]
    return config["Cmd"], config["Env"]


def last(daemon, path: str, **request: str) -> dict:
    *_, outcome = daemon.client.stream(path, request)
    return outcome


def test_a_wake_over_the_kv_bound_is_planned_as_a_stop_and_the_engine_runs_without_sleep_mode(
        switching, engine, monkeypatch) -> None:
    for key, value in SPARK.items():
        monkeypatch.setenv(key, value)
    daemon = switching(small=False, park="auto")  # 0.8 of 119 GiB: a KV region of about 91 GiB
    command, env = command_and_env(engine, A)
    [kv] = [int(a.split("=")[1]) for a in command if a.startswith("--kv-cache-memory-bytes=")]
    assert 85 << 30 < kv < 96 << 30
    assert "--enable-sleep-mode" not in command and not any(e.startswith("VLLM_SERVER_DEV_MODE") for e in env)
    outcome = switch(daemon, B)
    assert outcome["ok"], outcome.get("error")
    assert outcome["result"]["park"] == "stop"
    assert "over the safe bound 32.0 GiB" in outcome["result"]["why"]
    assert daemon.client.get("/v1/desired")["parked"] in ({}, {A: 0})
    assert [c for c in containers(engine, A) if c["State"] == "running"] == []


def test_only_one_engine_sleeps_at_a_time(switching, engine, monkeypatch) -> None:
    for key, value in SPARK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SPARKCTL_WAKE_KV_MAX_GIB", "64")  # 0.4 of 119 GiB is 43 GiB of KV: the other test has the bound
    daemon = switching(small=True, park="auto")
    up = last(daemon, "/v1/up", stack=B)
    assert up["ok"], up
    first = last(daemon, "/v1/park", stack=B, how="auto")
    assert first["ok"] and first["result"]["park"] == "sleep1", first
    second = last(daemon, "/v1/park", stack=A, how="auto")
    assert second["ok"] and second["result"]["park"] == "stop", second
    assert f"{B} sleeps already" in second["result"]["why"]
    assert daemon.client.get("/v1/desired")["parked"] == {B: 1, A: 0}
