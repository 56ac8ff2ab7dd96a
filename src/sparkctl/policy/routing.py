"""Routed aliases: an alias whose requests go to one of several stacks by the prompt's length.

Rules are ordered; each but the last has `up_to` (prompt tokens, inclusive) and the last takes the
rest. For example `primary`: up to 8192 tokens to `qwen36-dflash`, the rest to
`qwen36-nvfp4-aeon`. The reason is seed 000's crossover: DFlash decodes up to ~3x faster than no
speculation through ~8K of context and slower past it, and vLLM V1 cannot turn speculation off
per request (`speculative.max_model_len` is accepted and ignored, vLLM #52258).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sparkctl.errors import SparkctlError


@dataclass(frozen=True)
class Rule:
    stack: str
    up_to: int | None = None  # prompt tokens, inclusive; None: every longer prompt

    def describe(self) -> str:
        return f"up to {self.up_to} tokens -> {self.stack}" if self.up_to is not None else f"the rest -> {self.stack}"


def check(alias: str, rules: Sequence[Rule]) -> tuple[Rule, ...]:
    """The rules as given, or a SparkctlError saying what is wrong with them."""
    where = f"routed alias {alias!r}"
    if len(rules) < 2:
        raise SparkctlError(f"{where}: give at least two rules (a plain alias takes one stack)")
    *bounded, last = rules
    if last.up_to is not None:
        raise SparkctlError(f"{where}: the last rule takes the rest, so it has no `up_to` (it has {last.up_to})")
    limits = [r.up_to for r in bounded]
    if any(limit is None or limit < 1 for limit in limits):
        raise SparkctlError(f"{where}: every rule but the last needs `up_to`, a positive number of tokens")
    if limits != sorted(set(limits)):  # type: ignore[type-var]
        raise SparkctlError(f"{where}: `up_to` must grow from rule to rule, got {limits}")
    if len({r.stack for r in rules}) != len(rules):
        raise SparkctlError(f"{where}: a stack appears in two rules")
    return tuple(rules)


@dataclass(frozen=True)
class Serving:
    """What a routed stack takes: the context it serves and, when its deploy recorded it, its KV cache."""
    max_model_len: int | None = None
    kv_tokens: int | None = None


def fit(rules: Sequence[Rule], serving: Mapping[str, Serving]) -> list[str]:
    """How the prompts each rule sends fit its stack, a line per rule; a SparkctlError when a stack
    serves less context than its rule sends it (the engine would refuse those prompts)."""
    lines = []
    for rule in rules:
        s = serving[rule.stack]
        if rule.up_to is not None and s.max_model_len is not None and s.max_model_len < rule.up_to:
            raise SparkctlError(f"{rule.stack} serves at most {s.max_model_len:,} tokens of context, but its rule "
                                f"sends it prompts up to {rule.up_to:,}: lower the threshold or raise its "
                                "vllm.max_model_len")
        longest = rule.up_to or s.max_model_len
        if s.kv_tokens is None or longest is None:
            lines.append(f"{rule.stack}: KV cache unknown (its deploy recorded none)")
        else:
            lines.append(f"{rule.stack}: KV cache {s.kv_tokens:,} tokens, {s.kv_tokens / longest:.1f} prompts of "
                         f"{longest:,} tokens at once")
    return lines


def pick(rules: Sequence[Rule], tokens: int) -> int:
    """The index of the rule a prompt of `tokens` tokens goes to."""
    return next(i for i, rule in enumerate(rules) if rule.up_to is None or tokens <= rule.up_to)


def parse(text: str) -> Rule:
    """`STACK:TOKENS` (up to TOKENS) or `STACK` (the rest), as the CLI takes them."""
    stack, _, limit = text.partition(":")
    if not stack:
        raise SparkctlError(f"rule {text!r}: expected STACK:TOKENS or STACK")
    if not limit:
        return Rule(stack)
    try:
        return Rule(stack, int(limit.lower().removesuffix("k")) * (1024 if limit.lower().endswith("k") else 1))
    except ValueError:
        raise SparkctlError(f"rule {text!r}: {limit!r} is not a number of tokens (e.g. 8192 or 8k)") from None
