"""KV headroom: how many requests at full context an engine's KV cache holds at once, and what
falls short of the stack's settings. Pure.

Seed 003 sizes engines this way: DiffusionGemma's 3.59M KV tokens hold 13.7 requests at its
full 262K context, while Aeon Gemma-4 and Qwen "cap out around one or two". The deploy pipeline
builds a `Headroom` from what the engine reports once it is healthy and stores it with the
deployment; `up` and `status` show its summary and warnings. Two things fall short: fewer KV
tokens than the stack's `expectations.min_kv_tokens`, and fewer full-context requests than
`max_num_seqs` lets run at once (the rest queue in vLLM's scheduler until blocks free up).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from sparkctl.messages import KvRow


@dataclass(frozen=True)
class Headroom:
    kv_tokens: int  # the engine's KV-cache capacity, as it reports it
    max_model_len: int | None = None  # the context it serves (None: unknown)
    max_num_seqs: int | None = None  # how many requests it runs at once (None: vLLM's default, unknown here)
    min_kv_tokens: int | None = None  # the stack's expectation when it was deployed

    @property
    def full_context(self) -> float | None:
        """Requests at max_model_len the KV cache holds at once (vLLM's "maximum concurrency")."""
        return self.kv_tokens / self.max_model_len if self.max_model_len else None

    @property
    def needed(self) -> int | None:
        """KV tokens for max_num_seqs requests at full context."""
        return self.max_model_len * self.max_num_seqs if self.max_model_len and self.max_num_seqs else None

    def summary(self) -> str:
        """`13.7 full-context requests fit (KV cache 3.59M tokens, max_model_len 262,144)`."""
        if self.full_context is None:
            return f"KV cache {tokens(self.kv_tokens)} tokens"
        return (f"{self.full_context:.1f} full-context requests fit (KV cache {tokens(self.kv_tokens)} tokens, "
                f"max_model_len {self.max_model_len:,})")

    def warnings(self) -> tuple[str, ...]:
        """What falls short, each saying what to change; empty when nothing does."""
        found = []
        if self.min_kv_tokens is not None and self.kv_tokens < self.min_kv_tokens:
            found.append(f"the KV cache holds {self.kv_tokens:,} tokens, under the stack's "
                         f"expectations.min_kv_tokens {self.min_kv_tokens:,}: raise "
                         "resources.gpu_memory_utilization, use an fp8 kv_cache_dtype, or lower the expectation")
        if self.needed is not None and self.kv_tokens < self.needed:
            assert self.full_context is not None and self.max_num_seqs is not None
            at_once = math.floor(self.full_context)
            found.append(f"only {self.full_context:.2f} full-context requests fit in the KV cache "
                         f"({tokens(self.kv_tokens)} tokens at max_model_len {self.max_model_len:,}) but max_num_seqs "
                         f"is {self.max_num_seqs}: requests beyond {at_once} at full context will queue (lower "
                         "max_model_len or max_num_seqs, or raise gpu_memory_utilization, if they must run at once)")
        return tuple(found)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Headroom:
        """From `as_dict`, ignoring keys a later version may add."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def as_row(self) -> KvRow:
        """For `status` and the daemon's /v1/status: the figures, the fit and what falls short."""
        fit = self.full_context
        return KvRow(self.kv_tokens, self.max_model_len, self.max_num_seqs, self.min_kv_tokens,
                     round(fit, 1) if fit is not None else None, self.summary(), tuple(self.warnings()))


def tokens(n: int) -> str:
    """A token count as the seeds write it: 3.59M, 340K, 2,048."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.2f}M"
    if n >= 10_000:
        return f"{n / 1000:.0f}K"
    return f"{n:,}"
