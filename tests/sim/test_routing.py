"""Routed aliases at the gateway, in front of two simulated engines calibrated to seed 000 (DFlash
n=8 and its no-spec twin): each request goes by its prompt tokens, counted with the stack's own
tokenizer and chat template, and the engine's own `usage.prompt_tokens` confirms every decision;
per-rule counts on /metrics; a prompt that cannot be counted still gets served; and a route change
under an agent loop fails no request."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from sparkctl.gateway.tokens import Counters
from sparkctl.policy.routing import Rule
from tests.conftest import Running

THRESHOLD = 300
WORDS = "speculative decoding drafts several tokens and the target verifies them ".split()


@pytest.fixture
def routed(sim, tiny_model: Path) -> Iterator[tuple[Running, dict]]:
    short, long = sim("--sim-profile", "qwen36-dflash-n8"), sim("--sim-profile", "qwen36-nvfp4")
    short.wait_ready()
    long.wait_ready()
    upstreams = {"dflash": Upstream("dflash", short.url, "tiny"), "nvfp4": Upstream("nvfp4", long.url, "tiny")}
    state = {"table": RouteTable(upstreams=upstreams, rules={"primary": (Rule("dflash", THRESHOLD), Rule("nvfp4"))})}
    gateway = Gateway(lambda: state["table"])
    gateway.counters = Counters(lambda stack: tiny_model if stack != "broken" else Path("/nonexistent"))
    running = Running(gateway)
    yield running, state
    running.stop()


def client(running: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def ask(running: Running, words: int, *, model: str = "primary") -> tuple[str, int]:
    """A chat call of about `words` words: the stack that answered and the engine's prompt tokens."""
    text = " ".join(WORDS[i % len(WORDS)] for i in range(words))
    raw = client(running).chat.completions.with_raw_response.create(
        model=model, max_tokens=2, messages=[{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": text}])
    return raw.headers["x-sparkctl-stack"], raw.parse().usage.prompt_tokens


def test_each_request_goes_to_the_stack_whose_rule_holds_its_prompt(routed) -> None:
    running, _ = routed
    seen = [ask(running, words) for words in (1, 20, 80, 140, 150, 155, 160, 170, 300, 600)]
    assert {stack for stack, _ in seen} == {"dflash", "nvfp4"}
    for stack, tokens in seen:  # the engine's own count decides what was right
        assert stack == ("dflash" if tokens <= THRESHOLD else "nvfp4"), seen
    with urllib.request.urlopen(running.url + "/metrics") as page:
        text = page.read().decode()
    short = sum(1 for _, tokens in seen if tokens <= THRESHOLD)
    assert f'sparkctl_gateway_routed_total{{alias="primary",rule="0",stack="dflash"}} {short}' in text
    assert f'sparkctl_gateway_routed_total{{alias="primary",rule="1",stack="nvfp4"}} {len(seen) - short}' in text


def test_a_prompt_that_cannot_be_counted_goes_to_the_stack_for_the_rest(routed) -> None:
    running, state = routed
    upstreams = state["table"].upstreams | {"broken": Upstream("broken", state["table"].upstreams["dflash"].url,
                                                               "tiny")}
    state["table"] = RouteTable(upstreams=upstreams, rules={"primary": (Rule("broken", THRESHOLD), Rule("nvfp4"))})
    assert ask(running, 1)[0] == "nvfp4"


def test_a_route_change_under_an_agent_loop_fails_no_request(routed) -> None:
    running, state = routed
    failed, served, stop = [], [], threading.Event()

    def agent() -> None:
        while not stop.is_set():
            try:
                served.append(ask(running, 160))
            except Exception as e:  # noqa: BLE001 - every failure is the finding
                failed.append(repr(e))

    threads = [threading.Thread(target=agent) for _ in range(4)]
    for thread in threads:
        thread.start()
    upstreams = state["table"].upstreams
    try:
        for up_to in (100, 1000, 100, 1000):  # the 160-word prompt (~200 tokens) crosses the line each time
            state["table"] = RouteTable(upstreams=upstreams,
                                        rules={"primary": (Rule("dflash", up_to), Rule("nvfp4"))})
            expected, seen = "nvfp4" if up_to == 100 else "dflash", len(served)
            deadline = time.monotonic() + 30
            while sum(1 for stack, _ in served[seen:] if stack == expected) < 4:  # the new rule in force
                assert time.monotonic() < deadline and not failed, (failed, served[seen:])
                time.sleep(0.01)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert not failed
