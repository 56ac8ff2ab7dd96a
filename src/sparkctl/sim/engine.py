"""The simulated engine's generation, metrics and sleep mode: tokens, timing, speculation,
faults, and the memory it holds.

Timing follows a profile (profiles.py), divided by the time scale. Counters move with the
tokens actually served, so `/metrics` deltas mean what they mean on vLLM. Sleep and wake
follow vLLM 0.32's engine core (sleeping tags, paused scheduler, pause modes); with a memory
scale the weights and KV cache are real host memory, so MemAvailable moves as on a Spark.
The HTTP layer (server.py) drives this; main.py builds it.
"""

from __future__ import annotations

import asyncio
import hashlib
import mmap
import os
import random
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

from tokenizers import Tokenizer

from sparkctl.sim.profiles import Profile, kv_capacity

VERSION = "0.23.0+sparkctl.sim"
KV_BLOCK_SIZE = 16  # tokens per KV-cache block: vLLM's default on CUDA
PREFILL_CHUNK = 8192  # prompt tokens prefilled per step (vLLM's max_num_batched_tokens on a Spark's stacks)
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
    wake_keeps_backup: bool = False  # a level-1 wake frees the host copy last (vLLM #50011)
    queue_while_asleep: bool = False  # requests wait for /wake_up, as real vLLM's do, instead of a 503
    hang_requests: bool = False  # completions are read and never answered (a wedged engine core)
    # Start-up profiling on unified memory peaks this fraction of host memory above
    # --gpu-memory-utilization while it sizes the KV cache from it (vLLM #46307: 0.70 reached
    # ~112 of 119 GiB, 0.24 above); an absolute --kv-cache-memory-bytes skips that sizing.
    profile_overshoot: float = 0.0
    # Once this many requests have finished, the engine stops generating for good: running and new
    # requests freeze, /health stays 200 (the deadlock of eugr/spark-vllm-docker #260).
    deadlock_after: int | None = None
    # Once serving, the engine grows by this many MiB of real memory over `grow_s` seconds and holds
    # it: a startup's profiling or a wake that overshoots its plan (vLLM #46307), for the sentinel.
    grow_mib: int | None = None
    grow_s: float = 10.0
    # The share of the quality task's questions answered right (`quality.py`), in place of the profile's.
    accuracy: float | None = None
    # At temperature 0, replies are the same for the same prompt on every run (`Vocabulary.greedy`);
    # from this token on they are other ones: a build whose greedy outputs drift.
    drift_after: int | None = None

    @classmethod
    def parse(cls, text: str) -> Faults:
        """`crash_after=3,hang_on_load` (the SPARKCTL_SIM_FAULTS form)."""
        faults = cls()
        # None: a count, or a fraction where the field says so
        kinds = {f.name: (float if "float" in str(f.type) else int) if f.default is None else type(f.default)
                 for f in fields(cls)}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, _, value = item.partition("=")
            kind = kinds.get(key)
            if kind is None:
                raise ValueError(f"unknown fault {key!r}; known: {', '.join(kinds)}")
            setattr(faults, key, value.lower() not in ("0", "false", "no") if kind is bool else kind(value))
        return faults


_PAGE = 4096
_CHUNKS = 32  # an allocation rises in this many steps over its duration


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
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of them, found
    # The time the profile gave the requests, in a Spark's seconds (before the time scale):
    # what a benchmark here adds up to tell a Spark's time from the real overheads around it.
    engine_s: dict[str, float] = field(default_factory=lambda: {"prefill": 0.0, "decode": 0.0})
    ttft: Histogram = field(default_factory=lambda: Histogram(_TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(_ITL_BUCKETS))


class Memory:
    """Real host memory standing in for the engine's share of unified memory.

    Each region (`weights`, `kv_cache`, `backup`, the weights' host copy while asleep at level 1,
    and `profile`, start-up profiling's transient peak, and `growth`, the `grow_mib` fault's) is a
    private anonymous mmap with every page written, so MemAvailable (and the process's RssAnon)
    really move; unmapping releases it. Sizes of 0 (no memory scale) hold nothing and only take
    time.
    """

    def __init__(self, *, weights: int = 0, kv_cache: int = 0, profile: int = 0) -> None:
        self.sizes = {"weights": weights, "kv_cache": kv_cache, "backup": weights, "profile": profile, "growth": 0}
        self._regions: dict[str, mmap.mmap] = {}
        self._touched = dict.fromkeys(self.sizes, 0)  # fixed keys: read from the event loop mid-allocation

    def held(self) -> int:
        """Bytes written so far in the regions now mapped."""
        return sum(self._touched.values())

    def allocate(self, name: str, seconds: float) -> None:
        """Map `name` and write its pages a chunk at a time, spread over `seconds`, so the rise
        can be watched. Blocks: the engine runs it on a thread."""
        size = self.sizes[name]
        if not size or name in self._regions:
            time.sleep(seconds)
            return
        region = self._regions[name] = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        chunk = -(-size // _CHUNKS // _PAGE) * _PAGE
        for start in range(0, size, chunk):
            end = min(size, start + chunk)
            region[start:end:_PAGE] = b"\1" * len(range(start, end, _PAGE))
            self._touched[name] = end
            time.sleep(seconds * (end - start) / size)

    def free(self, name: str) -> None:
        region = self._regions.pop(name, None)
        self._touched[name] = 0
        if region is not None:
            region.close()


class PrefixCache:
    """vLLM's automatic prefix caching, by whole KV blocks: a block is known by its tokens and all
    the tokens before it, and a prompt's leading known blocks are not prefilled again. It holds
    what the KV cache holds (its capacity), the least recently used block leaving first."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens // KV_BLOCK_SIZE
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def hit(self, ids: Sequence[int]) -> int:
        """Tokens of the prompt already cached; the last token is always computed (as in vLLM)."""
        found = 0
        for key in _block_keys(ids[:-1]):
            if key not in self.blocks:
                break
            self.blocks.move_to_end(key)
            found += KV_BLOCK_SIZE
        return found

    def keep(self, ids: Sequence[int]) -> None:
        for key in _block_keys(ids):
            self.blocks[key] = None
            self.blocks.move_to_end(key)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)

    def clear(self) -> None:
        self.blocks.clear()


def _block_keys(ids: Sequence[int]) -> Iterator[int]:
    key = 0
    for start in range(0, len(ids) - KV_BLOCK_SIZE + 1, KV_BLOCK_SIZE):
        key = hash((key, tuple(ids[start:start + KV_BLOCK_SIZE])))
        yield key


class Aborted(Exception):
    """A request cut by `/sleep` in its default `abort` mode; vLLM finishes it with "abort"."""


class Vocabulary:
    """Token counting and token-by-token text from the model's own tokenizer.json."""

    def __init__(self, model_dir: Path, seed: int = 0) -> None:
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        pieces = [(i, self.tokenizer.decode([i])) for i in range(self.tokenizer.get_vocab_size())]
        words = [(i, p) for i, p in pieces if p.strip().isalpha() and p.isprintable()]
        self.pool = words or [(i, p) for i, p in pieces if p.isprintable() and p] or [(0, "x")]
        self.rng = random.Random(seed)

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def tokens(self, n: int) -> list[tuple[int, str]]:
        """`n` random (id, text) tokens of the model's vocabulary."""
        return [self.rng.choice(self.pool) for _ in range(n)]

    def greedy(self, prompt: str, n: int, *, drift_after: int | None = None) -> list[tuple[int, str]]:
        """A reply at temperature 0: `n` tokens fixed by `prompt`, the same on every run, with or
        without speculation (verification is lossless); from token `drift_after` on, each one
        another than it would be (the `drift_after` fault)."""
        same, other = random.Random(_digest(prompt)), random.Random(_digest("drift:" + prompt))
        tokens = [same.choice(self.pool) for _ in range(n)]
        for k in range(drift_after if drift_after is not None else n, n):
            drawn = other.choice(self.pool)
            tokens[k] = drawn if drawn[1] != tokens[k][1] else next(t for t in self.pool if t[1] != tokens[k][1])
        return tokens

    @staticmethod
    def greedy_length(prompt: str) -> int:
        """Where a reply at temperature 0 would end of itself: 12 to 40 tokens, fixed by `prompt`."""
        return 12 + _digest("length:" + prompt) % 29

    def script(self, text: str) -> list[tuple[int, str]]:
        """`text` as the model's (id, text) tokens, whose texts join back to `text` exactly."""
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        tokens, done = [], 0
        for i, (_, end) in zip(encoding.ids, encoding.offsets, strict=True):
            if end > done:
                tokens.append((i, text[done:end]))
                done = end
        if tokens and done < len(text):
            tokens[-1] = (tokens[-1][0], tokens[-1][1] + text[done:])
        return tokens


class Engine:
    def __init__(self, profile: Profile, vocab: Vocabulary, *, num_speculative: int, scale: float,
                 max_model_len: int, memory_fraction: float, faults: Faults, seed: int = 0,
                 memory: Memory | None = None, sleep_mode: bool = False, prefix_caching: bool = False) -> None:
        self.profile, self.vocab, self.scale = profile, vocab, scale
        self.num_speculative, self.max_model_len, self.faults = num_speculative, max_model_len, faults
        self.metrics = Metrics(accepted_per_pos=[0] * num_speculative)
        self.rng = random.Random(seed)
        self.healthy = True
        # What the memory fraction leaves after the weights becomes KV cache; requests that
        # don't fit wait, as vLLM's scheduler makes them.
        self.memory_fraction = memory_fraction
        self.kv_capacity = kv_capacity(profile, memory_fraction)
        self.kv_used = 0
        self.prefix_cache = PrefixCache(self.kv_capacity) if prefix_caching else None
        self._released = asyncio.Event()
        # Sleep mode, as vLLM's engine core keeps it. Without --enable-sleep-mode vLLM still
        # answers /sleep and /wake_up, but its allocator holds nothing to release.
        self.memory = memory or Memory()
        self.sleep_mode = sleep_mode
        self.sleeping: set[str] = set()  # tags parked: "weights", "kv_cache"
        self.level = 0  # of the last sleep
        self.paused = False  # the scheduler admits nothing new
        self.stale_weights = False  # a level-2 wake maps empty weights until reload_weights
        self._admitting = asyncio.Event()  # cleared while paused: new requests queue
        self._stepping = asyncio.Event()  # cleared by a `keep` pause: running requests freeze
        self._admitting.set()
        self._stepping.set()
        self._aborts = 0  # bumped by each `abort` pause; requests admitted before it end
        self._utility = asyncio.Lock()  # engine-core calls (sleep, wake_up, ...) run one at a time

    def output_length(self, *, prompt_tokens: int, max_tokens: int | None, min_tokens: int, ignore_eos: bool,
                      scripted: int = 0) -> int:
        """Tokens to generate: a `scripted` answer's own length, else 12 to 40, within the limits."""
        limit = self.max_model_len - prompt_tokens
        wanted = limit if max_tokens is None else min(max_tokens, limit)
        if ignore_eos:
            return wanted
        natural = max(min_tokens, scripted or self.rng.randint(12, 40))
        return min(natural, wanted)

    @property
    def accuracy(self) -> float:
        """The share of the quality task answered right: the `accuracy` fault's, else the profile's."""
        return self.profile.accuracy if self.faults.accuracy is None else self.faults.accuracy

    async def generate(self, *, prompt: Sequence[int], length: int,
                       script: Sequence[tuple[int, str]] = ()) -> AsyncIterator[list[tuple[int, str]]]:
        """Yield the tokens (id, text) of each engine step, at the profile's speed: the `script`'s
        (an answer the engine has, `quality.py`), else random ones; a prompt's blocks in the prefix
        cache are not prefilled again."""
        prompt_tokens = len(prompt)
        m, need, start, aborts = self.metrics, prompt_tokens + length, time.monotonic(), self._aborts
        m.requests_waiting += 1
        try:
            await self._wait_for_room(need, aborts)
        finally:
            m.requests_waiting -= 1
        self.kv_used += need
        self._admit()
        try:
            cached = 0
            if self.prefix_cache is not None:
                cached = self.prefix_cache.hit(prompt)
                m.prefix_queries += prompt_tokens
                m.prefix_hits += cached
            m.prompt_tokens += cached
            await self._prefill(prompt_tokens - cached, self.profile.prefill_tps(prompt_tokens))
            if self.prefix_cache is not None:
                self.prefix_cache.keep(prompt)
            clock = last = time.monotonic()
            emitted = 0
            while emitted < length:
                if self.deadlocked:
                    await asyncio.Event().wait()  # never set: the engine stopped generating
                if not self._stepping.is_set():
                    await self._stepping.wait()
                    clock = time.monotonic()
                if self._aborts != aborts:
                    raise Aborted
                step = min(self._step_tokens(), length - emitted)
                took = step / self.profile.decode_tps(prompt_tokens + emitted)
                m.engine_s["decode"] += took
                clock += took * self.scale
                await asyncio.sleep(max(0.0, clock - time.monotonic()))
                now = time.monotonic()
                (m.itl if emitted else m.ttft).observe(now - (last if emitted else start))
                last = now
                emitted += step
                m.generation_tokens += step
                yield self._tokens(step, script[emitted - step:emitted])
        finally:
            m.requests_running -= 1
            m.requests_finished += 1
            self.kv_used -= need
            self._released.set()

    @property
    def asleep(self) -> bool:
        """vLLM's is_sleeping: the scheduler is paused or some memory is parked."""
        return self.paused or bool(self.sleeping)

    async def is_sleeping(self) -> bool:
        async with self._utility:  # answered after a sleep or wake under way, as in vLLM
            return self.asleep

    async def sleep(self, level: int, mode: str) -> None:
        """Pause the scheduler (`abort` ends running requests, `wait` lets them finish, `keep`
        freezes them), then park: level 1 backs the weights up to host memory and drops them
        and the KV cache, level 2 drops both, level 0 only pauses."""
        async with self._utility:
            self.paused = True
            self._admitting.clear()
            if mode == "keep":
                self._stepping.clear()
            if mode == "abort":
                self._aborts += 1
                self._released.set()  # requests waiting for KV room find themselves aborted
            while mode == "wait" and self.metrics.requests_running:
                self._released.clear()
                await self._released.wait()
            if self.sleeping:  # vLLM: "Executor is already sleeping."
                return
            self.level = level
            if level == 0:
                return
            self.sleeping = {"weights", "kv_cache"}
            held = self.memory.held()
            if self.sleep_mode:
                await self._park(level)
            log(f"Sleep mode freed {(held - self.memory.held()) / 2**30:.2f} GiB memory, "
                 f"{self.memory.held() / 2**30:.2f} GiB memory is still in use.")

    async def wake_up(self, tags: list[str] | None) -> bool:
        """Bring back the parked tags (all when None); the scheduler resumes once nothing is
        parked. Returns whether the engine is fully awake."""
        async with self._utility:
            if tags is not None:
                tags = [t for t in tags if t != "scheduling"]
            wanted = set(self.sleeping if tags is None else tags)
            if self.sleeping and wanted <= self.sleeping and (tags is None or tags):
                if self.sleep_mode:
                    await self._restore(wanted)
                self.sleeping -= wanted
            if not self.sleeping:
                self.paused = False
                self._admitting.set()
                self._stepping.set()
            return not self.sleeping

    async def reload_weights(self) -> None:
        """`collective_rpc reload_weights`: read the weights again into the memory a level-2
        wake mapped."""
        async with self._utility:
            await asyncio.sleep(self.profile.reload_s * self.scale)
            self.stale_weights = False

    async def reset_prefix_cache(self, *, reset_running: bool) -> bool:
        """Fails while running requests hold blocks, unless they are reset too (vLLM)."""
        async with self._utility:
            if not (reset_running or not self.metrics.requests_running):
                return False
            if self.prefix_cache is not None:
                self.prefix_cache.clear()
            return True

    async def grow(self) -> None:
        """The `grow_mib` fault: real memory taken over `grow_s` seconds, and held."""
        if self.faults.grow_mib:
            self.memory.sizes["growth"] = self.faults.grow_mib << 20
            log(f"growing by {self.faults.grow_mib} MiB over {self.faults.grow_s:g} s (injected)")
            await self._allocate("growth", self.faults.grow_s)

    @property
    def deadlocked(self) -> bool:
        after = self.faults.deadlock_after
        return after is not None and self.metrics.requests_finished >= after

    async def _prefill(self, tokens: int, tps: float) -> None:
        """Prefill `tokens` at `tps`, counting prompt tokens chunk by chunk as vLLM's chunked
        prefill does: a long prefill moves `vllm:prompt_tokens_total` while it runs."""
        clock = time.monotonic()
        for done in range(0, tokens, PREFILL_CHUNK):
            chunk = min(PREFILL_CHUNK, tokens - done)
            self.metrics.engine_s["prefill"] += chunk / tps
            clock += chunk / tps * self.scale
            await asyncio.sleep(max(0.0, clock - time.monotonic()))
            self.metrics.prompt_tokens += chunk

    async def _park(self, level: int) -> None:
        p, s = self.profile, self.scale
        if level == 1:
            await self._allocate("backup", p.copy_s * s)
        self.memory.free("weights")
        self.memory.free("kv_cache")
        await asyncio.sleep(p.remap_s * s)

    async def _restore(self, wanted: set[str]) -> None:
        p, s, memory = self.profile, self.scale, self.memory
        if "weights" in wanted:
            await self._allocate("weights", (p.copy_s if self.level == 1 else p.remap_s) * s)
            self.stale_weights = self.level == 2
            if not self.faults.wake_keeps_backup:
                memory.free("backup")
        if "kv_cache" in wanted:
            await self._allocate("kv_cache", p.remap_s * s)
        if "weights" in wanted:
            memory.free("backup")  # with wake_keeps_backup, the host copy was held until now

    async def _allocate(self, name: str, seconds: float) -> None:
        await asyncio.to_thread(self.memory.allocate, name, seconds)  # the loop keeps answering meanwhile

    async def _wait_for_room(self, need: int, aborts: int) -> None:
        """Queue until the scheduler admits new requests and the KV cache has room."""
        while True:
            await self._admitting.wait()
            if self._aborts != aborts:
                raise Aborted
            if not self.kv_used or self.kv_used + need <= self.kv_capacity:
                return
            self._released.clear()
            await self._released.wait()

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

    def _tokens(self, n: int, scripted: Sequence[tuple[int, str]] = ()) -> list[tuple[int, str]]:
        tokens = list(scripted) or self.vocab.tokens(n)
        if self.faults.empty:
            return [(i, "") for i, _ in tokens]
        if self.faults.garbage or self.stale_weights:
            return [(i, "".join(chr(self.rng.randint(0x21, 0x2F)) for _ in range(3))) for i, _ in tokens]
        return tokens

    def die(self, reason: str) -> None:
        """Engine death: vLLM logs the error and the process exits."""
        print(f"ERROR [core.py] EngineCore encountered a fatal error.\n{reason}", file=sys.stderr, flush=True)
        self.healthy = False
        os._exit(1)


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def log(message: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [sim] {message}", file=sys.stderr, flush=True)


def die(message: str) -> None:
    """Exit as vLLM does on a fatal error: its message last on stderr, exit code 1."""
    print(f"ERROR {time.strftime('%m-%d %H:%M:%S')} [sim] {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)
