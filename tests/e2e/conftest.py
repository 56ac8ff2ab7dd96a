"""Engines the contract suite runs against, unchanged: the simulated one and real vLLM (CPU)."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.conftest import TEST_LABEL, EngineContainer

ARGS = {
    "sim": ("--max-model-len", "2048", "--gpu-memory-utilization", "0.2", "--sim-profile", "aeon-gemma4-v2"),
    "vllm-cpu": ("--max-model-len", "2048", "--gpu-memory-utilization", "0.2", "--enforce-eager"),
}
ENV = {"sim": {"SPARKCTL_SIM_TIME_SCALE": "0.02"},  # ~2.4 s of loading, 4000 tok/s decode
       "vllm-cpu": {"VLLM_CPU_KVCACHE_SPACE": "1"}}  # GiB of KV cache, not a share of the machine's memory


# Real vLLM on two CPU cores: its start (up to `wait_ready`'s 180 s) lands in the first test that
# asks for it, and llama-benchy's run may take up to its own 300 s bound.
@pytest.fixture(scope="session", params=["sim", pytest.param("vllm-cpu", marks=pytest.mark.timeout(600))])
def served(request, engine, images, tiny_model_dir) -> Iterator[EngineContainer]:
    """One engine per kind for the whole session; `before_load` is /health right after start."""
    kind = request.param
    run_id = uuid.uuid4().hex[:10]
    container = EngineContainer(engine, images[kind], tiny_model_dir, *ARGS[kind], run_id=run_id,
                                env=ENV[kind])
    container.kind = kind
    container.before_load = container.status()
    container.wait_ready()
    yield container
    for c in engine.client.api.containers(all=True, filters={"label": f"{TEST_LABEL}={run_id}"}):
        engine.remove(c["Id"])


@pytest.fixture(scope="session")
def book_url() -> Iterator[str]:
    """A long English text on loopback, as llama-benchy's prompt corpus (no internet here)."""
    root = Path("/usr/share/common-licenses")
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/GPL-3"
    server.shutdown()


def assert_measured(runs: list[dict]) -> None:
    """Each test answered its 16 tokens, and every rate llama-benchy could time is positive. Both
    engines here answer in a few ms, often in one network read, and then llama-benchy has no two
    timestamps to time prefill or decode with (it reports None, not a wrong rate). Rates at an
    engine's real speed are checked by tests/integration/test_bench.py."""
    assert all(b["response_size"] == 16 for b in runs)
    rates = [b[key]["mean"] for b in runs for key in ("pp_throughput", "tg_throughput") if b[key]]
    assert all(rate > 0 for rate in rates)


def llama_benchy(base_url: str, model: str, tokenizer: Path, book_url: str, out: Path) -> list[dict]:
    """llama-benchy 0.4.0 offline (pp64/tg16 at depths 0 and 128, one run); its measured tests."""
    subprocess.run([
        sys.executable, "-m", "llama_benchy", "--base-url", base_url, "--model", model,
        "--tokenizer", str(tokenizer), "--book-url", book_url, "--pp", "64", "--tg", "16",
        "--depth", "0", "128", "--runs", "1", "--latency-mode", "generation", "--exact-tg",
        "--skip-coherence", "--format", "json", "--save-result", str(out)],
        check=True, capture_output=True, text=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["version"].startswith("0.4") and result["model"] == model
    return [b for b in result["benchmarks"] if not b["is_context_prefill_phase"]]
