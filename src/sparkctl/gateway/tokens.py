"""A request's prompt tokens, counted the way the engine counts them, for routed aliases.

Each stack's own tokenizer (`tokenizer.json`) and chat template (`chat_template` of
`tokenizer_config.json`, or `chat_template.jinja`), read from the model's snapshot once. A chat
request's messages, tools and `chat_template_kwargs` are rendered with the template as vLLM does
(jinja2, sandboxed, `trim_blocks` and `lstrip_blocks`, with the generation prompt) and the text
is tokenized without adding special tokens (the template writes them); a completions prompt is
tokenized with them. Content given as parts is joined as vLLM joins text parts (with newlines);
images and audio are not counted. A template that fails to render falls back to the messages'
text alone, which undercounts by the template's own tokens.

Routing asks only on which side of a threshold the prompt falls: a rendered prompt whose UTF-8
size is at most the lowest threshold less `MARGIN` is under it in tokens too (a token of a
byte-level BPE or a byte-fallback tokenizer spans at least one byte), so short prompts are
routed without tokenizing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from sparkctl.errors import SparkctlError

MARGIN = 8  # tokens a tokenizer may add beyond one per byte (a BOS, a SentencePiece prefix space)


@dataclass
class PromptCounter:
    tokenizer: Tokenizer
    template: Any  # a compiled jinja2 template, or None
    specials: dict[str, str]  # bos_token, eos_token: what templates may write

    def text(self, path: str, payload: dict) -> tuple[str, bool]:
        """The prompt as the engine will tokenize it, and whether special tokens are added."""
        if not path.endswith("chat/completions"):
            prompt = payload.get("prompt", "")
            return ("".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)), True
        messages = [m | {"content": _text(m.get("content"))} if isinstance(m, dict) else m
                    for m in payload.get("messages") or []]
        if self.template is not None:
            try:
                return self.template.render(messages=messages, tools=payload.get("tools"), add_generation_prompt=True,
                                            **self.specials, **(payload.get("chat_template_kwargs") or {})), False
            except Exception:  # noqa: BLE001 - the engine will answer the error; counting falls back to the text
                pass
        return "".join(m.get("content") or "" for m in messages if isinstance(m, dict)), False

    def count(self, path: str, payload: dict) -> int:
        text, special = self.text(path, payload)
        return len(self.tokenizer.encode(text, add_special_tokens=special).ids)

    def at_most(self, path: str, payload: dict, limit: int) -> int | None:
        """The prompt's tokens, or None when its size alone shows it is at most `limit` tokens."""
        text, special = self.text(path, payload)
        if len(text.encode()) + MARGIN <= limit:
            return None
        return len(self.tokenizer.encode(text, add_special_tokens=special).ids)


def load(model_dir: Path) -> PromptCounter:
    """The counter of the model in `model_dir` (a snapshot with tokenizer.json)."""
    try:
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    except Exception as e:  # noqa: BLE001 - a missing or unreadable file, said with its path
        raise SparkctlError(f"no usable tokenizer.json in {model_dir} ({e}); `sparkctl up` downloads the model") from e
    config = _json(model_dir / "tokenizer_config.json")
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if source is None and (model_dir / "chat_template.jinja").is_file():
        source = (model_dir / "chat_template.jinja").read_text()
    specials = {k: _token(config.get(k)) for k in ("bos_token", "eos_token")}
    return PromptCounter(tokenizer, _compile(source) if isinstance(source, str) else None, specials)


class Counters:
    """One counter per stack, loaded once on first use (`find` gives its model's snapshot dir)."""

    def __init__(self, find: Callable[[str], Path]) -> None:
        self.find = find
        self._loaded: dict[str, PromptCounter] = {}

    def get(self, stack: str) -> PromptCounter:
        counter = self._loaded.get(stack)
        if counter is None:
            counter = self._loaded[stack] = load(self.find(stack))
        return counter

    def loaded(self, stack: str) -> bool:
        return stack in self._loaded


def _compile(source: str) -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _raise(message: str) -> None:
    raise ValueError(message)


def _text(content: object) -> object:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


def _token(value: object) -> str:
    return value.get("content", "") if isinstance(value, dict) else str(value or "")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
