"""The simulated engine's generation and metrics: tokens, timing, speculation, faults.

Timing follows a profile (profiles.py), divided by the time scale. Counters move with the
tokens actually served, so `/metrics` deltas mean what they mean on vLLM. The HTTP layer
(server.py) drives this.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from sparkctl.sim.profiles import Profile, kv_capacity

VERSION = "0.23.0+sparkctl.sim"
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


@dataclass
class Faults:
    crash_after: int | None = None  # exit once this many requests have been served
    crash_above: int | None = None  # exit when more than this many run at once
    hang_on_load: bool = False  # never finish loading (the port never opens)
    crash_on_load: bool = False  # die while loading, as an engine whose weights don't fit does
    slow_health: float = 0.0  # seconds /health takes to answer
    garbage: bool = False  # completions are random bytes-as-text
    empty: bool = False  # completions are empty

    @classmethod
    def parse(cls, text: str) -> Faults:
        """`crash_after=3,hang_on_load` (the SPARKCTL_SIM_FAULTS form)."""
        faults = cls()
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition("=")
            kind = _FAULT_KINDS.get(key)
            if kind is None:
                raise ValueError(f"unknown fault {key!r}; known: {', '.join(_FAULT_KINDS)}")
            setattr(faults, key, value.lower() not in ("0", "false", "no") if kind is bool else kind(value))
        return faults


_FAULT_KINDS = {"crash_after": int, "crash_above": int, "hang_on_load": bool, "crash_on_load": bool,
                "slow_health": float, "garbage": bool, "empty": bool}


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.total += value
        self.n += 1


@dataclass
class Metrics:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_running: int = 0
    requests_waiting: int = 0
    requests_finished: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    diffusion_committed: int = 0
    diffusion_steps: int = 0
    diffusion_canvas: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(_TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(_ITL_BUCKETS))


class Vocabulary:
    """Token counting and token-by-token text from the model's own tokenizer.json."""

    def __init__(self, model_dir: Path, seed: int = 0) -> None:
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        pieces = [(i, self.tokenizer.decode([i])) for i in range(self.tokenizer.get_vocab_size())]
        words = [(i, p) for i, p in pieces if p.strip().isalpha() and p.isprintable()]
        self.pool = words or [(i, p) for i, p in pieces if p.isprintable() and p] or [(0, "x")]
        self.rng = random.Random(seed)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def pieces(self, n: int) -> list[str]:
        return [self.rng.choice(self.pool)[1] for _ in range(n)]


class Engine:
    def __init__(self, profile: Profile, vocab: Vocabulary, *, num_speculative: int, scale: float,
                 max_model_len: int, memory_fraction: float, faults: Faults, seed: int = 0) -> None:
        self.profile, self.vocab, self.scale = profile, vocab, scale
        self.num_speculative, self.max_model_len, self.faults = num_speculative, max_model_len, faults
        self.metrics = Metrics(accepted_per_pos=[0] * num_speculative)
        self.rng = random.Random(seed)
        self.healthy = True
        # What the memory fraction leaves after the weights becomes KV cache; requests that
        # don't fit wait, as vLLM's scheduler makes them.
        self.kv_capacity = kv_capacity(profile, memory_fraction)
        self.kv_used = 0
        self._released = asyncio.Event()

    def output_length(self, *, prompt_tokens: int, max_tokens: int | None, min_tokens: int, ignore_eos: bool) -> int:
        limit = self.max_model_len - prompt_tokens
        wanted = limit if max_tokens is None else min(max_tokens, limit)
        if ignore_eos:
            return wanted
        natural = max(min_tokens, self.rng.randint(12, 40))
        return min(natural, wanted)

    async def generate(self, *, prompt_tokens: int, length: int) -> AsyncIterator[list[str]]:
        """Yield the text pieces of each engine step, at the profile's speed."""
        m, need, start = self.metrics, prompt_tokens + length, time.monotonic()
        m.requests_waiting += 1
        while self.kv_used and self.kv_used + need > self.kv_capacity:
            self._released.clear()
            await self._released.wait()
        m.requests_waiting -= 1
        self.kv_used += need
        self._admit()
        m.prompt_tokens += prompt_tokens
        try:
            await asyncio.sleep(prompt_tokens / self.profile.prefill_tps(prompt_tokens) * self.scale)
            clock = last = time.monotonic()
            emitted = 0
            while emitted < length:
                step = min(self._step_tokens(), length - emitted)
                clock += step / self.profile.decode_tps(prompt_tokens + emitted) * self.scale
                await asyncio.sleep(max(0.0, clock - time.monotonic()))
                now = time.monotonic()
                (m.itl if emitted else m.ttft).observe(now - (last if emitted else start))
                last = now
                emitted += step
                m.generation_tokens += step
                yield self._text(step)
        finally:
            m.requests_running -= 1
            m.requests_finished += 1
            self.kv_used -= need
            self._released.set()

    def _admit(self) -> None:
        m, f = self.metrics, self.faults
        m.requests_running += 1
        cap = min(c for c in (f.crash_above, self.profile.crash_above, 10**9) if c is not None)
        if m.requests_running > cap:
            self.die(f"RuntimeError: CUDA error: an illegal memory access was encountered "
                     f"({m.requests_running} concurrent requests)")
        if f.crash_after is not None and m.requests_finished >= f.crash_after:
            self.die(f"RuntimeError: engine core died after {m.requests_finished} requests (injected)")

    def _step_tokens(self) -> int:
        m = self.metrics
        if self.profile.block > 1:
            m.diffusion_steps += 1
            m.diffusion_committed += self.profile.block
            m.diffusion_canvas += self.profile.block * 2
            return self.profile.block
        if not self.num_speculative:
            return 1
        # The profile's acceptance is what vLLM's metrics report: accepted / drafted tokens.
        accepted = sum(self.rng.random() < self.profile.acceptance for _ in range(self.num_speculative))
        for pos in range(accepted):
            m.accepted_per_pos[pos] += 1
        m.drafts += 1
        m.draft_tokens += self.num_speculative
        m.accepted_tokens += accepted
        return accepted + 1

    def _text(self, n: int) -> list[str]:
        if self.faults.empty:
            return [""] * n
        if self.faults.garbage:
            return ["".join(chr(self.rng.randint(0x21, 0x2F)) for _ in range(3)) for _ in range(n)]
        return self.vocab.pieces(n)

    def die(self, reason: str) -> None:
        """Engine death: vLLM logs the error and the process exits."""
        print(f"ERROR [core.py] EngineCore encountered a fatal error.\n{reason}", file=sys.stderr, flush=True)
        self.healthy = False
        os._exit(1)
