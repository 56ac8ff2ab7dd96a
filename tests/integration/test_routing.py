"""Routed aliases through a real daemon, dockerd and sim engines: `sparkctl route set` names two
running stacks, the gateway sends each prompt by its tokens (the engines' own usage confirms each
decision), /metrics counts per rule, a stack not up is refused, a switch of the routed alias is
refused with what to do, and an agent on the routed alias sees no failed request while its rules
change and while `primary` switches away from a stack the route names (which stays up).
Then `sparkctl route show` lists the rules, and `sparkctl bench agent` replays the short session
through the route and writes its report."""

from __future__ import annotations

import threading
import urllib.request
from pathlib import Path

import openai

from tests.integration.agents import A, B, switch
from tests.integration.conftest import containers, wait_for

WORDS = "speculative decoding drafts several tokens and the target verifies them ".split()


def route(daemon, alias: str, rules: str) -> dict:
    *_, outcome = daemon.client.stream("/v1/route", {"alias": alias, "rules": rules})
    return outcome


def ask(client: openai.OpenAI, words: int) -> tuple[str, int]:
    text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    raw = client.chat.completions.with_raw_response.create(model="long", max_tokens=2,
                                                           messages=[{"role": "user", "content": text}])
    return raw.headers["x-sparkctl-stack"], raw.parse().usage.prompt_tokens


def test_a_routed_alias_through_the_daemon(switching, engine, cli, world: Path) -> None:
    daemon = switching(small=True)
    client = openai.OpenAI(base_url=daemon.gateway + "/v1", api_key="x", max_retries=0, timeout=60)
    refused = route(daemon, "long", f"{A}:300 {B}")
    assert not refused["ok"] and f"{B} is neither up nor parked" in refused["error"]
    *_, up = daemon.client.stream("/v1/up", {"stack": B})
    assert up["ok"], up
    too_long = route(daemon, "long", f"{A}:1000000 {B}")
    assert not too_long["ok"] and f"{A} serves at most" in too_long["error"]
    done = route(daemon, "long", f"{A}:300 {B}")
    assert done["ok"] and done["result"]["rules"] == [{"stack": A, "up_to": 300}, {"stack": B, "up_to": None}]
    assert [line.split(":")[0] for line in done["result"]["fit"]] == [A, B]
    assert "prompts of 300 tokens at once" in done["result"]["fit"][0]  # the sims report their KV cache
    seen = [ask(client, words) for words in (5, 100, 150, 170, 400)]
    assert all(stack == (A if tokens <= 300 else B) for stack, tokens in seen), seen
    assert {s for s, _ in seen} == {A, B}
    metrics = urllib.request.urlopen(daemon.gateway + "/metrics").read().decode()
    assert f'sparkctl_gateway_routed_total{{alias="long",rule="1",stack="{B}"}}' in metrics
    refused = switch(daemon, A, alias="long")
    assert not refused["ok"] and "long is routed by prompt length" in refused["error"]

    failed, served, stop = [], [], threading.Event()

    def agent() -> None:
        while not stop.is_set():
            try:
                served.append(ask(client, 170))
            except openai.OpenAIError as e:
                failed.append(repr(e))

    def answered_by(stack: str) -> None:
        seen = len(served)
        wait_for(lambda: failed or any(s == stack for s, _ in served[seen:]), timeout=30, what=f"{stack} answers")

    thread = threading.Thread(target=agent)
    thread.start()
    try:
        for rules, expected in ((f"{A}:100 {B}", B), (f"{A}:1000 {B}", A), (f"{A}:100 {B}", B)):
            assert route(daemon, "long", rules)["ok"]
            answered_by(expected)  # the 170-word prompt (~220 tokens) goes by the new rules
        moved = switch(daemon, B)  # primary leaves A, which the route still names
        assert moved["ok"], moved.get("error")
        assert route(daemon, "long", f"{A}:1000 {B}")["ok"]
        answered_by(A)
    finally:
        stop.set()
        thread.join(60)
    assert not failed
    running = sorted(c["Labels"]["sparkctl.stack"] for c in containers(engine) if c["State"] == "running")
    assert running == sorted([A, B])

    code, out, err = cli("route", "show")  # the daemon's answer, read as its type
    rows = [line.split() for line in out.splitlines() if A in line or B in line]
    assert code == 0 and [r for r in rows if "1000" in r and A in r] and [r for r in rows if "rest" in r], out
    code, out, err = cli("bench", "agent", "long", "--session", "short")
    assert code == 0, err + out
    report = next((world / "state" / "bench").glob("agent-*/agent.md")).read_text()
    assert "| short | long | 30 |" in report and "agent_wait_vs_context.png" in report
