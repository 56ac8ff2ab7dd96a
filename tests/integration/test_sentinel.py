"""The sentinel and the hang watch on a real daemon, dockerd and sim engines (docs/design.md,
"Unified memory safety"): kernel-log lines fed from a file the test appends to make it refuse the
newest engine's requests (503 + Retry-After) and stop it; its last words survive a `kill -9` of the
daemon and `doctor` and `status` show them; a sim engine that deadlocks (its /health still 200)
is taken out of routing and restarted, and an agent loop through the gateway loses at most the
request in flight."""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path

import openai

from sparkctl.deploy.memory import GIB
from tests.conftest import name
from tests.integration.conftest import SMALL, wait_for

A, B = "qwen36-dflash", "qwen36-nvfp4-stock"
NVRM = "NVRM: _memdescAllocInternal: nvAssertFailedNoLog: Assertion failed: NV_ERR_NO_MEMORY [NV_ERR_NO_MEMORY]"


def gateway() -> str:
    return f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"


def ask(model: str) -> tuple[int, dict, dict]:
    """One chat request through the gateway: status, headers, body."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{gateway()}/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


def running(engine, stack: str) -> bool:
    return engine.inspect(name(stack)).status == "running"


def test_an_nvrm_line_stops_the_newest_engine_and_its_last_words_survive_a_kill9(
        world: Path, start_daemon, cli, engine) -> None:
    for stack in (A, B):
        with (world / "stacks" / f"{stack}.yaml").open("a") as f:
            f.write(SMALL)
    (world / "state").mkdir(exist_ok=True)
    (world / "state" / "desired.yaml").write_text(f"stacks: [{A}]\n")
    daemon = start_daemon()
    wait_for(lambda: ask(A)[0] == 200, timeout=60, what=f"{A} served", logs=daemon.logs)
    assert cli("up", B)[0] == 0  # the engine that grew last
    with (world / "kmsg").open("a") as kmsg:
        kmsg.write(f"3,4711,123456789,-;{NVRM}\n")
    wait_for(lambda: not running(engine, B), timeout=10, what=f"{B} stopped", logs=daemon.logs)
    assert running(engine, A)
    status, headers, body = ask(B)
    assert status == 503 and 0 < int(headers["Retry-After"]) <= 60, (status, body)
    assert body["error"]["code"] == "memory_pressure" and body["error"].get("source") == "sparkctl", body
    assert ask(A)[0] == 200  # the other engine serves on
    wait_for(lambda: '"sentinel_stopped_engine"' in daemon.logs(), timeout=10, what="the sentinel's log line")
    [line] = [json.loads(x) for x in daemon.logs().splitlines() if '"sentinel_stopped_engine"' in x]
    assert line["stack"] == B and line["sign"] == "nvrm_oom" and "NV_ERR_NO_MEMORY" in line["detail"], line
    assert daemon.client.get("/v1/desired")["parked"] == {B: 0}

    daemon.kill9()
    code, out, _ = cli("doctor", "--only", "sentinel", "--json")
    words = {c["name"]: c for c in json.loads(out)["checks"]}["last words"]
    assert words["status"] == "warn" and "did not stop cleanly" in words["detail"], words
    assert "NV_ERR_NO_MEMORY" in words["detail"] and f"{A} serving" in words["detail"], words
    start_daemon()  # the next daemon keeps them as the previous run's
    code, out, _ = cli("status")
    assert code == 0 and "did not stop cleanly" in out and "NV_ERR_NO_MEMORY" in out, out


def test_memory_falling_under_the_floor_stops_the_engine(world: Path, start_daemon, engine) -> None:
    (world / "state").mkdir(exist_ok=True)
    (world / "state" / "desired.yaml").write_text(f"stacks: [{A}]\n")
    daemon = start_daemon()
    wait_for(lambda: ask(A)[0] == 200, timeout=60, what=f"{A} served", logs=daemon.logs)
    meminfo = world / "meminfo"
    lines = [f"MemAvailable:   {GIB // 1024} kB" if line.startswith("MemAvailable:") else line
             for line in meminfo.read_text().splitlines()]
    meminfo.write_text("\n".join(lines) + "\n")  # 1 GiB left, under the 4 GiB floor
    wait_for(lambda: '"sign": "memory_low"' in daemon.logs(), timeout=10, what="the sentinel's log line",
             logs=daemon.logs)
    assert not running(engine, A)
    assert ask(A)[0] == 503  # refused, not woken


def test_a_deadlocked_engine_is_restarted_and_the_agent_loses_at_most_the_request_in_flight(
        world: Path, start_daemon, engine, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_HANG_AFTER", "2")
    with (world / "stacks" / f"{A}.yaml").open("a") as f:
        f.write("container:\n  env:\n    SPARKCTL_SIM_FAULTS: deadlock_after=3\n")
    (world / "state").mkdir(exist_ok=True)
    (world / "state" / "desired.yaml").write_text(f"stacks: [{A}]\naliases: {{primary: {A}}}\n")
    daemon = start_daemon()
    wait_for(lambda: ask("primary")[0] == 200, timeout=60, what="primary served", logs=daemon.logs)
    agent = openai.OpenAI(base_url=f"{gateway()}/v1", api_key="x", max_retries=0, timeout=90)
    outcomes: list[str] = []
    done = threading.Event()

    def loop() -> None:
        history = [{"role": "system", "content": "You are a coding agent."}]
        for _ in range(6):  # the engine deadlocks at the 3rd of them: 2 done at readiness + 1
            history.append({"role": "user", "content": "Summarise src/main.py."})
            try:
                reply = agent.chat.completions.create(model="primary", messages=history[-4:], max_tokens=8)
                outcomes.append("ok")
                history.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
            except openai.OpenAIError as e:
                outcomes.append(f"{type(e).__name__}: {e}")
        done.set()

    worker = threading.Thread(target=loop)
    worker.start()
    worker.join(180)
    assert done.is_set(), f"the agent loop did not end: {outcomes}\n{daemon.logs()[-3000:]}"
    failed = [o for o in outcomes if o != "ok"]
    assert len(failed) <= daemon.logs().count("\"engine_hung\""), outcomes  # at most those in flight at a hang
    logs = daemon.logs()
    assert '"engine_hung"' in logs and '"engine_routed_again"' in logs, logs[-3000:]
    kinds = [e["kind"] for e in daemon.client.get(f"/v1/history?stack={A}")["events"]]
    assert "hung" in kinds and "restarted" in kinds, kinds
    assert running(engine, A)
