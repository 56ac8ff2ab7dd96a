"""Reads a healthy engine's KV headroom: its KV-cache size, the context it serves and how many
requests it runs at once. Called by the pipeline once a deployment runs.

The KV size comes from `vllm:cache_config_info` on /metrics or from vLLM's startup log line
(`bench.metrics.kv_tokens` picks the best of both). max_model_len is the engine's own (its model
card on /v1/models: vLLM may lower the flag's value to fit), else the container's command line;
max_num_seqs is the command line's (for a compose project, the values compose ran it with), else
the stack's. The comparison itself is `policy.headroom`.
"""

from __future__ import annotations

import re

from sparkctl.adapters import engine
from sparkctl.adapters.docker import DockerEngine
from sparkctl.bench.metrics import kv_tokens
from sparkctl.errors import SparkctlError
from sparkctl.policy.headroom import Headroom
from sparkctl.spec.models import Stack

LOG_LINES = 20_000  # the startup line comes early; a fresh container's log is far shorter
SIZE = re.compile(r"^(\d+)([kKmM]?)$")
UNITS = {"": 1, "k": 1000, "K": 1024, "m": 1_000_000, "M": 1024 * 1024}  # vLLM's human_readable_int


def read(stack: Stack, url: str, container: str, docker: DockerEngine) -> Headroom:
    """The running engine's headroom; a SparkctlError when it reports no KV-cache size."""
    try:
        text = engine.text(url, "/metrics", timeout=10)
        command = list(docker.inspect(container).command)
        found = kv_tokens(text + "\n" + docker.logs(container, tail=LOG_LINES))
        cards = engine.models(url, timeout=10)
        served = next((c.get("max_model_len") for c in cards if c.get("id") == stack.served_name), None)
    except (OSError, ValueError) as e:
        raise SparkctlError(f"could not ask the engine at {url} for its KV-cache size: {e}") from None
    if found is None:
        raise SparkctlError("the engine reports no KV-cache size (no vllm:cache_config_info on /metrics, "
                            "no `KV cache size: N tokens` line in its log)")
    vllm = stack.vllm
    return Headroom(kv_tokens=found,
                    max_model_len=served or flag(command, "--max-model-len") or (vllm.max_model_len if vllm else None),
                    max_num_seqs=flag(command, "--max-num-seqs") or (vllm.max_num_seqs if vllm else None),
                    min_kv_tokens=stack.expectations.min_kv_tokens)


def flag(argv: list[str], name: str) -> int | None:
    """An integer flag's value as vLLM's argparse reads it: `--flag N` or `--flag=N`, dashes or
    underscores, `128k`-style sizes; the last one wins. None when absent or not a number."""
    value = None
    for i, arg in enumerate(argv):
        key, sep, inline = arg.partition("=")
        if key.replace("_", "-") != name:
            continue
        value = inline if sep else (argv[i + 1] if i + 1 < len(argv) else None)
    match = SIZE.match(value or "")
    return int(match[1]) * UNITS[match[2]] if match else None
