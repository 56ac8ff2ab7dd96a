"""The `agent` benchmark: how long an agent waits, not tokens per second (seed 003's question).

A session replays an agent's chat calls one at a time, as an agent would, with the official
`openai` client: each call sends the whole history so far plus a new tool result, and asks for a
short tool-call answer or, every few calls, a longer reasoning answer (`ignore_eos`, so each
answer has its intended length). Its shape (system prompt and tool schema sizes, tool results,
answer sizes; `sessions/*.yaml`, each with where its numbers come from) is data.

Measured per call: the time to the first token, the decode time after it, the total, the
context it was sent with (the engine's own `usage.prompt_tokens`), the stack that answered
(the gateway's `X-Sparkctl-Stack`; a routed alias picks per call) and, when the engines' URLs
are given, the speculative acceptance over the call from that engine's /metrics counters. Per
session: the wall time, and the wait per call at its median and its worst.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from sparkctl.adapters import engine
from sparkctl.bench import metrics
from sparkctl.errors import SpecError
from sparkctl.spec import yamlfile

KINDS = ("tool", "reasoning")


@dataclass(frozen=True)
class Phase:
    calls: int
    result_tokens: int  # each tool result's size
    reasoning_every: int = 0  # every n-th call of the session reasons at length (0: never)


@dataclass(frozen=True)
class Shape:
    name: str
    system_tokens: int
    tools_tokens: int
    answer_tokens: dict[str, int]  # "tool", "reasoning" -> tokens
    phases: tuple[Phase, ...]

    def calls(self) -> list[tuple[int, str]]:
        """Each call's tool-result tokens and answer kind, in order."""
        found: list[tuple[int, str]] = []
        for phase in self.phases:
            for _ in range(phase.calls):
                every = phase.reasoning_every
                found.append((phase.result_tokens, "reasoning" if every and (len(found) + 1) % every == 0 else "tool"))
        return found


@dataclass(frozen=True)
class Call:
    index: int
    kind: str
    context: int  # prompt tokens, as the engine counted them
    stack: str  # the stack that answered
    ttft_s: float
    decode_s: float
    total_s: float
    completion_tokens: int
    acceptance: float | None = None


@dataclass
class Session:
    shape: str
    model: str  # the stack or alias it was sent to
    calls: list[Call] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def median_wait_s(self) -> float:
        return statistics.median(c.total_s for c in self.calls)

    @property
    def worst_wait_s(self) -> float:
        return max(c.total_s for c in self.calls)

    def to_dict(self) -> dict[str, Any]:
        return {"shape": self.shape, "model": self.model, "wall_s": round(self.wall_s, 3),
                "median_wait_s": round(self.median_wait_s, 3), "worst_wait_s": round(self.worst_wait_s, 3),
                "calls": [asdict(c) for c in self.calls]}


def shape(name: str) -> Shape:
    """A shipped session shape by name (`short`, `long`), or a shape file by path."""
    path = Path(name)
    if not path.suffix:
        path = Path(str(resources.files("sparkctl.bench") / "sessions" / f"{name}.yaml"))
    if not path.is_file():
        shipped = sorted(p.name.removesuffix(".yaml") for p in (resources.files("sparkctl.bench") / "sessions")
                         .iterdir() if p.name.endswith(".yaml"))
        raise SpecError(name, "", f"no such session shape; shipped: {', '.join(shipped)}, or give a file's path")
    data = yamlfile.read(path) or {}
    where = str(path)
    try:
        answers = {k: int(v) for k, v in data["answer_tokens"].items()}
        phases = tuple(Phase(int(p["calls"]), int(p["result_tokens"]), int(p.get("reasoning_every", 0)))
                       for p in data["phases"])
        found = Shape(str(data["name"]), int(data["system_tokens"]), int(data["tools_tokens"]), answers, phases)
    except KeyError as e:
        raise SpecError(where, str(e.args[0]), "missing: a shape has name, system_tokens, tools_tokens, answer_tokens "
                        "{tool, reasoning} and phases [{calls, result_tokens, reasoning_every}]") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise SpecError(where, "", f"not a session shape: {e}") from None
    if set(answers) != set(KINDS) or min(answers.values()) < 1 or not phases or \
            min(min(p.calls, p.result_tokens) for p in phases) < 1:
        raise SpecError(where, "phases", "answer_tokens needs tool and reasoning >= 1, and every phase calls >= 1 "
                        "and result_tokens >= 1")
    return found


class Filler:
    """Text of a given number of tokens, cut from one long corpus by the model's tokenizer, a
    different stretch each time (so no two tool results are the same)."""

    def __init__(self, tokenizer: Any, corpus: str) -> None:
        self.tokenizer, self.ids, self.at = tokenizer, tokenizer.encode(corpus, add_special_tokens=False).ids, 0

    def __call__(self, tokens: int) -> str:
        if self.at + tokens > len(self.ids):
            self.at = 0
        piece = self.ids[self.at:self.at + tokens]
        self.at += tokens
        return self.tokenizer.decode(piece)


def run(client: Any, model: str, spec: Shape, fill: Callable[[int], str], *,
        engines: Mapping[str, str] | None = None, on_call: Callable[[Call], None] = lambda _: None) -> Session:
    """One session against `model` (a stack or an alias) through `client` (an `openai.OpenAI`)."""
    system = fill(spec.system_tokens) + "\n\n# Tools\n" + fill(spec.tools_tokens)
    history: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": fill(200)}]
    session, began = Session(spec.name, model), time.monotonic()
    for index, (result, kind) in enumerate(spec.calls()):
        if index:
            history.append({"role": "tool", "tool_call_id": f"call_{index}", "content": fill(result)})
        call, answer = _call(client, model, history, index, kind, spec.answer_tokens[kind], engines or {})
        history.append({"role": "assistant", "content": answer})
        session.calls.append(call)
        on_call(call)
    session.wall_s = time.monotonic() - began
    return session


def _call(client: Any, model: str, history: list[dict[str, Any]], index: int, kind: str, tokens: int,
          engines: Mapping[str, str]) -> tuple[Call, str]:
    before = {stack: _counters(url) for stack, url in engines.items()}
    began = time.monotonic()
    first, pieces, usage = None, [], None
    with client.chat.completions.with_streaming_response.create(
            model=model, messages=history, max_tokens=tokens, stream=True, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True}) as response:
        stack = response.headers.get("x-sparkctl-stack", model)
        for chunk in response.parse():
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.monotonic()
                pieces.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
    done = time.monotonic()
    first = first or done
    acceptance = None
    if stack in engines and before.get(stack) is not None and (after := _counters(engines[stack])) is not None:
        acceptance = metrics.between(before[stack], after).acceptance
    call = Call(index, kind, usage.prompt_tokens if usage else 0, stack, round(first - began, 4),
                round(done - first, 4), round(done - began, 4), usage.completion_tokens if usage else len(pieces),
                acceptance)
    return call, "".join(pieces)


def _counters(url: str) -> dict[str, float] | None:
    try:
        return metrics.parse(engine.text(url, "/metrics", timeout=5))
    except OSError:
        return None


def save(folder: Path, sessions: list[dict[str, Any]]) -> Path:
    """Sessions (as `Session.to_dict` gives them) in `folder/agent-sessions.json`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "agent-sessions.json"
    path.write_text(json.dumps(sessions, indent=2))
    return path
