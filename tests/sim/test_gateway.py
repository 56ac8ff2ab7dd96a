"""The gateway in front of simulated engines: the official openai client through it, routing by
alias and served name, the sparkctl error envelope, API keys, concurrency caps and client
disconnects."""

from __future__ import annotations

import asyncio
import http.client
import inspect
import json
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running, wait_for


@pytest.fixture
def engines(sim) -> dict[str, object]:
    fast, capped = sim("--sim-profile", "aeon-gemma4-v2", scale=0.01), sim("--sim-profile", "qwen36-nvfp4", scale=0.01)
    fast.wait_ready()
    capped.wait_ready()
    return {"fast": fast, "capped": capped}


def two_stacks(engines) -> RouteTable:
    return RouteTable(upstreams={
        "gemma": Upstream("gemma", engines["fast"].url, "tiny"),
        "qwen": Upstream("qwen", engines["capped"].url, "tiny", max_concurrency=1)},
        aliases={"primary": "gemma", "serial": "qwen"})


@pytest.fixture
def gateway(engines) -> Iterator[Running]:
    table = two_stacks(engines)
    running = Running(Gateway(lambda: table))
    yield running
    running.stop()


def on_loop(running: Running, method: Callable[..., Any], *args: Any) -> Any:
    """A method of the gateway, called on its loop (as the daemon's switch calls it) from this
    (test) thread, which waits for its answer."""
    async def call() -> Any:
        answer = method(*args)
        return await answer if inspect.isawaitable(answer) else answer

    return asyncio.run_coroutine_threadsafe(call(), running.loop).result(30)


def client(running: Running, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=running.url + "/v1", api_key=key, max_retries=0)


def test_the_openai_client_through_the_gateway(gateway) -> None:
    c = client(gateway)
    reply = c.chat.completions.create(model="primary", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    assert reply.choices[0].message.content and reply.model == "tiny" and reply.usage.completion_tokens <= 8
    chunks = list(c.chat.completions.create(model="primary", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=12, stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 12 and chunks[0].choices[0].delta.role == "assistant"
    assert [m.id for m in c.models.list().data] == ["primary", "serial", "tiny", "tiny"]


def test_unknown_model_is_a_sparkctl_404(gateway) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client(gateway).completions.create(model="gpt-9", prompt="x", max_tokens=1)
    assert e.value.body["source"] == "sparkctl" and "GET /v1/models" in e.value.body["message"]


def test_api_keys_are_required_when_configured(engines) -> None:
    table = RouteTable(upstreams={"gemma": Upstream("gemma", engines["fast"].url, "tiny")})
    running = Running(Gateway(lambda: table, api_keys=["sk-local-1"]))
    try:
        with pytest.raises(openai.AuthenticationError):
            client(running, "sk-wrong").completions.create(model="tiny", prompt="x", max_tokens=1)
        assert client(running, "sk-local-1").completions.create(model="tiny", prompt="x", max_tokens=1).choices
    finally:
        running.stop()


def test_a_capped_stack_sees_one_request_at_a_time_with_16_clients(gateway) -> None:
    results: list[int] = []

    def call() -> None:
        reply = client(gateway).completions.create(model="serial", prompt="x", max_tokens=20,
                                                   extra_body={"ignore_eos": True})
        results.append(reply.usage.completion_tokens)

    threads = [threading.Thread(target=call) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == [20] * 16
    assert gateway.gateway.ledger.snapshot().peak["qwen"] == 1


def test_a_client_that_disconnects_frees_the_upstream_slot(gateway, engines) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"model": "serial", "prompt": "x", "max_tokens": 50000,
                                                        "ignore_eos": True, "stream": True}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.read(6) == b"data: "
    conn.sock.close()  # the agent goes away mid-stream
    conn.close()
    # the capped slot is free again: the next request does not wait for 50000 tokens (~56 s)
    reply = client(gateway).completions.create(model="serial", prompt="x", max_tokens=4, timeout=10)
    assert reply.choices[0].text is not None
    # and the engine stopped generating for the client that left
    deadline = time.monotonic() + 5
    while re.search(r"vllm:num_requests_running\{.*\} 0\.0",
                    urllib.request.urlopen(engines["capped"].url + "/metrics", timeout=5).read().decode()) is None:
        assert time.monotonic() < deadline, "the engine still generates for a client that left"
        time.sleep(0.05)


def test_an_engine_that_is_down_or_dies_mid_stream_is_a_clean_error(sim) -> None:
    engine = sim("--sim-profile", "aeon-gemma4-v2", scale=0.01)
    engine.wait_ready()
    table = RouteTable(upstreams={"gemma": Upstream("gemma", engine.url, "tiny"),
                                  "gone": Upstream("gone", "http://127.0.0.1:9", "other")})
    running = Running(Gateway(lambda: table))
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client(running).completions.create(model="other", prompt="x", max_tokens=1)
        assert e.value.status_code == 502 and e.value.body["code"] == "upstream_unavailable"
        assert e.value.body["source"] == "sparkctl" and "stack gone did not answer" in e.value.body["message"]

        stream = client(running).completions.create(model="tiny", prompt="x", max_tokens=50000, stream=True,
                                                    extra_body={"ignore_eos": True})
        next(iter(stream))
        engine.stop()  # killed mid-stream: the client's stream ends instead of hanging
        with pytest.raises(openai.APIError, match="engine stopped mid-answer") as cut:  # sparkctl's error event,
            for _ in stream:  # then the connection closes without the response's end: not a silent end
                pass
        assert cut.value.body["source"] == "sparkctl" and cut.value.body["code"] == "upstream_unavailable"
        assert urllib.request.urlopen(running.url + "/health", timeout=5).status == 200
    finally:
        running.stop()


def test_held_requests_wait_and_go_in_order_to_the_new_stack(engines) -> None:
    tables = {"now": RouteTable(upstreams={"gemma": Upstream("gemma", engines["fast"].url, "tiny")},
                                aliases={"primary": "gemma"})}
    running = Running(Gateway(lambda: tables["now"]))
    try:
        on_loop(running, running.gateway.hold, "primary", "gemma", "qwen")
        health = json.loads(urllib.request.urlopen(running.url + "/health").read())
        assert health["switching"][0] | {"for_s": 0} == {"alias": "primary", "from": "gemma", "to": "qwen",
                                                         "held": 0, "for_s": 0}
        answered: list[tuple[int, str]] = []

        def call(i: int) -> None:
            reply = client(running).completions.with_raw_response.create(model="primary", prompt="x", max_tokens=2)
            answered.append((i, reply.headers["x-sparkctl-stack"]))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
        hold = running.gateway.holds["primary"]
        for n, t in enumerate(threads, 1):
            t.start()
            wait_for(lambda n=n: len(hold.waiting) == n, what=f"request {n} held")  # arrival order
        assert not answered
        models = client(running).models.list().data
        assert models[0].id == "primary" and models[0].switching["to"] == "qwen"
        tables["now"] = RouteTable(upstreams={"qwen": Upstream("qwen", engines["capped"].url, "tiny",
                                                               max_concurrency=1)}, aliases={"primary": "qwen"})
        released = on_loop(running, running.gateway.release, "primary")
        for t in threads:
            t.join(30)
        assert released["held_requests"] == 4
        assert answered == [(0, "qwen"), (1, "qwen"), (2, "qwen"), (3, "qwen")]  # capped at 1: served in order
    finally:
        running.stop()


@pytest.fixture
def strict(engines) -> Iterator[Running]:
    """The two stacks behind a gateway that holds one request at most, for 1 s."""
    table = two_stacks(engines)
    running = Running(Gateway(lambda: table, hold_queue=1, hold_timeout=1.0))
    yield running
    running.stop()


def test_hold_timeout_and_a_full_queue_answer_503_with_retry_after(strict) -> None:
    gateway = strict
    on_loop(gateway, gateway.gateway.hold, "primary", "gemma", "qwen")
    timed_out: list[int] = []

    def held() -> None:
        try:
            client(gateway).completions.create(model="primary", prompt="x", max_tokens=1)
        except openai.InternalServerError as e:
            timed_out.append(e.status_code)

    first = threading.Thread(target=held)
    first.start()
    hold = gateway.gateway.holds["primary"]
    wait_for(lambda: len(hold.waiting) == 1, what="the first request held")
    with pytest.raises(openai.InternalServerError) as full:  # the one place is taken
        client(gateway).completions.create(model="primary", prompt="x", max_tokens=1)
    first.join(30)
    assert timed_out == [503]
    assert full.value.status_code == 503 and full.value.response.headers["Retry-After"] == "5"
    assert "already waiting" in full.value.body["message"] and full.value.body["source"] == "sparkctl"
    assert gateway.gateway.holds["primary"].refused == 2  # the first one timed out
    assert client(gateway).completions.create(model="serial", prompt="x", max_tokens=1).choices  # others flow


def test_drain_waits_for_accepted_requests_including_those_queued_at_a_cap(gateway) -> None:
    calls = [threading.Thread(target=lambda: client(gateway).completions.create(
        model="serial", prompt="x", max_tokens=300, extra_body={"ignore_eos": True})) for _ in range(3)]
    for t in calls:
        t.start()
    wait_for(lambda: on_loop(gateway, gateway.gateway.ledger.snapshot).accepted.get("qwen") == 3, what="3 accepted")
    counts = on_loop(gateway, gateway.gateway.ledger.snapshot)
    assert counts.accepted["qwen"] == 3 and counts.in_flight["qwen"] == 1
    assert asyncio.run_coroutine_threadsafe(gateway.gateway.drain("qwen", 0.01), gateway.loop).result(5) is False
    assert on_loop(gateway, gateway.gateway.drain, "qwen") is True  # within the gateway's drain timeout
    assert gateway.gateway.ledger.snapshot().accepted["qwen"] == 0
    for t in calls:
        t.join(60)


def test_a_stopping_gateway_answers_held_requests_at_once(gateway) -> None:
    on_loop(gateway, gateway.gateway.hold, "primary", "gemma", "qwen")
    refused: list[openai.InternalServerError] = []

    def held() -> None:
        try:
            client(gateway).completions.create(model="primary", prompt="x", max_tokens=1)
        except openai.InternalServerError as e:
            refused.append(e)

    waiting = threading.Thread(target=held)
    waiting.start()
    wait_for(lambda: gateway.gateway.holds["primary"].waiting, what="the request held")
    started = time.monotonic()
    finished = asyncio.run_coroutine_threadsafe(gateway.gateway.finish(timeout=30), gateway.loop).result(40)
    waiting.join(10)
    assert finished and time.monotonic() - started < 5
    assert refused[0].status_code == 503 and "the gateway is stopping" in refused[0].body["message"]


def test_request_defaults_reach_the_engine_unless_the_client_set_them(sim) -> None:
    engine = sim("--sim-profile", "aeon-gemma4-v2", scale=0.01)
    engine.wait_ready()
    defaults = {"chat_template_kwargs": {"enable_thinking": True, "effort": "high"}, "max_tokens": 5,
                "ignore_eos": True}
    table = RouteTable(upstreams={"think": Upstream("think", engine.url, "tiny", request_defaults=defaults),
                                  "plain": Upstream("plain", engine.url, "tiny")}, aliases={"primary": "think"})
    running = Running(Gateway(lambda: table))
    chat = client(running).chat.completions.with_raw_response
    hi = [{"role": "user", "content": "hi"}]
    try:
        filled = chat.create(model="primary", messages=hi)  # the engine echoes the kwargs it received
        assert filled.headers["x-sim-chat-template-kwargs"] == '{"effort":"high","enable_thinking":true}'
        assert filled.parse().usage.completion_tokens == 5  # max_tokens 5 and ignore_eos, both defaults
        mine = chat.create(model="think", messages=hi, max_tokens=3, stream=True,
                           stream_options={"include_usage": True},
                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert mine.headers["x-sim-chat-template-kwargs"] == '{"effort":"high","enable_thinking":false}'
        assert list(mine.parse())[-1].usage.completion_tokens == 3  # the client's max_tokens wins
        completion = client(running).completions.with_raw_response.create(model="think", prompt="x")
        assert completion.parse().usage.completion_tokens == 5 and "x-sim-chat-template-kwargs" in completion.headers
        other = chat.create(model="plain", messages=hi, max_tokens=2)  # another stack gets none of them
        assert "x-sim-chat-template-kwargs" not in other.headers
    finally:
        running.stop()
