"""The simulated engine's HTTP API, shaped like vLLM's OpenAI server (aiohttp).

Routes: /health, /version, /v1/models, /metrics, /v1/chat/completions, /v1/completions, with
vLLM's JSON and SSE chunk shapes (a question of sparkctl's quality task gets its answer,
`quality.py`; anything else random tokens of the model's vocabulary); in dev mode
(VLLM_SERVER_DEV_MODE=1) also vLLM 0.32's /sleep, /wake_up, /is_sleeping, /collective_rpc and
/reset_prefix_cache. Built by `main.py` once loading is done.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from aiohttp import web

from sparkctl.sim import quality
from sparkctl.sim.engine import KV_BLOCK_SIZE, VERSION, Aborted, Engine, Histogram, Vocabulary, log
from sparkctl.sim.ranks import Group, GroupBroken

_PAUSE_MODES = ("abort", "wait", "keep")


class Api:
    def __init__(self, engine: Engine, *, served_name: str, root: str, max_model_len: int,
                 dev_mode: bool = False, workers: int = 1, group: Group | None = None) -> None:
        self.engine, self.served_name, self.max_model_len = engine, served_name, max_model_len
        self.root, self.dev_mode, self.workers = root, dev_mode, workers
        self.group = group  # the other ranks, when this is rank 0 of a multi-node group
        self.created = int(time.time())

    def app(self, *, access_log: bool = True) -> web.Application:
        app = web.Application(client_max_size=64 * 1024**2, middlewares=[_access] if access_log else [])
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        if self.dev_mode:  # vLLM registers these routes only in dev mode: 404 otherwise
            app.router.add_post("/sleep", self.sleep)
            app.router.add_post("/wake_up", self.wake_up)
            app.router.add_get("/is_sleeping", self.is_sleeping)
            app.router.add_post("/collective_rpc", self.collective_rpc)
            app.router.add_post("/reset_prefix_cache", self.reset_prefix_cache)
        return app

    async def health(self, _: web.Request) -> web.Response:
        if self.engine.faults.slow_health:
            await asyncio.sleep(self.engine.faults.slow_health)
        return web.Response(status=200 if self.engine.healthy else 503)

    async def version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": VERSION})

    async def models(self, _: web.Request) -> web.Response:
        card = {"id": self.served_name, "object": "model", "created": self.created, "owned_by": "vllm",
                "root": self.root, "parent": None, "max_model_len": self.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list", "BadRequestError")
        prompt = "".join(f"<|{m.get('role')}|>{_content(m.get('content'))}\n" for m in messages) + "<|assistant|>"
        return await self._complete(request, body, prompt, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await _json(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = "".join(map(str, prompt))
        if not isinstance(prompt, str):
            return _error(400, "prompt must be a string", "BadRequestError")
        return await self._complete(request, body, prompt, chat=False)

    async def _complete(self, request: web.Request, body: dict, prompt: str, *, chat: bool) -> web.StreamResponse:
        if body.get("model") != self.served_name:
            return _error(404, f"The model `{body.get('model')}` does not exist. Valid aliases: "
                          f"{self.served_name}.", "NotFoundError", param="model")
        if self.group is not None:
            try:
                await self.group.step()
            except GroupBroken as e:
                return _error(500, f"EngineCore encountered an issue: {e}", "InternalServerError")
        ids = self.engine.vocab.ids(prompt)
        prompt_tokens = len(ids)
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if prompt_tokens + (max_tokens or 1) > self.max_model_len:
            return _error(400, f"This model's maximum context length is {self.max_model_len} tokens. However, "
                          f"you requested {prompt_tokens + (max_tokens or 1)} tokens.", "BadRequestError")
        reply_text = quality.answer(prompt, self.engine.accuracy)
        script = self.engine.vocab.script(reply_text) if reply_text is not None else []
        greedy = reply_text is None and body.get("temperature") == 0  # the same reply for the same prompt
        length = self.engine.output_length(prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                           min_tokens=int(body.get("min_tokens") or 0),
                                           ignore_eos=bool(body.get("ignore_eos")),
                                           scripted=Vocabulary.greedy_length(prompt) if greedy else len(script))
        if greedy:
            script = self.engine.vocab.greedy(prompt, length, drift_after=self.engine.faults.drift_after)
        if self.engine.asleep and not self.engine.faults.queue_while_asleep:
            # Real vLLM queues the request until /wake_up; the sim answers at once.
            return _error(503, "The engine is sleeping; POST /wake_up to serve requests again.",
                          "ServiceUnavailableError")
        if self.engine.faults.hang_requests:
            await asyncio.Event().wait()  # until the client leaves (or the engine stops)
        reply = _Reply(chat=chat, model=self.served_name, prompt_tokens=prompt_tokens, length=length,
                       token_ids=bool(body.get("return_token_ids")))
        steps = self.engine.generate(prompt=ids, length=length, script=script)
        echo = _echo(body)
        if body.get("stream"):
            return await self._stream(request, reply, steps, body.get("stream_options") or {}, echo)
        tokens: list[tuple[int, str]] = []
        try:
            async for step in steps:
                tokens += step
        except Aborted:
            reply.abort(len(tokens))
        return web.json_response(reply.whole(tokens), headers=echo)

    async def _stream(self, request: web.Request, reply: _Reply, steps: Any, options: dict,
                      echo: dict[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **echo})
        await response.prepare(request)
        if reply.chat:
            await _send(response, reply.chunk([], role=True))
        emitted = 0
        try:
            async for step in steps:
                emitted += len(step)
                await _send(response, reply.chunk(step))
        except Aborted:
            reply.abort(emitted)
        finally:
            await steps.aclose()  # a client that left aborts its request at once, as in vLLM
        await _send(response, reply.chunk([], finish=True))
        if options.get("include_usage"):
            await _send(response, reply.usage_chunk())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=render_metrics(self.engine, self.served_name), content_type="text/plain")

    async def sleep(self, request: web.Request) -> web.Response:
        level, mode = request.query.get("level", "1"), request.query.get("mode", "abort")
        if level not in ("0", "1", "2"):
            return _error(400, f"1 validation error:\n  level: Input should be 0, 1 or 2 (got {level!r})",
                          "Bad Request", param="level")
        if mode not in _PAUSE_MODES:
            return _error(400, f"1 validation error:\n  mode: Input should be 'abort', 'wait' or 'keep' "
                          f"(got {mode!r})", "Bad Request", param="mode")
        await self.engine.sleep(int(level), mode)
        return web.json_response({"status": "sleeping", "level": int(level)})

    async def wake_up(self, request: web.Request) -> web.Response:
        tags = request.query.getall("tags", []) or None
        awake = await self.engine.wake_up(tags)
        return web.json_response({"status": "awake" if awake else "sleeping", "tags": tags})

    async def is_sleeping(self, _: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": await self.engine.is_sleeping()})

    async def collective_rpc(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return _error(400, f"JSON decode error: {e}", "Bad Request")
        if not isinstance(body, dict):
            return _error(400, "Request body must be a JSON object", "Bad Request")
        method = body.get("method")
        if method is None:
            return _error(400, "Missing 'method' in request body", "Bad Request")
        if method != "reload_weights":  # the one worker method the sim has
            return _error(500, f"Call to collective_rpc method failed: Method {method!r} is not implemented.",
                          "InternalServerError")
        await self.engine.reload_weights()
        return web.json_response({"results": [None] * self.workers})  # one per worker

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        reset_running = request.query.get("reset_running_requests", "false").lower() in ("1", "true", "yes", "on")
        return web.json_response({"success": await self.engine.reset_prefix_cache(reset_running=reset_running)})


class _Reply:
    """Builds vLLM-shaped response bodies for one request. With `return_token_ids` (vLLM 0.10.2 on),
    each choice also carries the ids of its tokens, one streamed chunk's or the whole answer's:
    llama-benchy asks for them, and times each token by them (without them it spreads the tokens
    evenly from the first chunk to the last, which overstates the decode of an engine whose first
    chunk holds many tokens: a diffusion block, or a step's accepted drafts)."""

    def __init__(self, *, chat: bool, model: str, prompt_tokens: int, length: int, token_ids: bool = False) -> None:
        self.chat, self.model, self.prompt_tokens, self.length = chat, model, prompt_tokens, length
        self.token_ids = token_ids
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.finish = "length" if length else "stop"

    def abort(self, emitted: int) -> None:
        """Cut by /sleep: finish with what was emitted, as vLLM's finish_reason "abort"."""
        self.length, self.finish = emitted, "abort"

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens + self.length,
                "completion_tokens": self.length}

    def whole(self, tokens: list[tuple[int, str]]) -> dict[str, Any]:
        text = "".join(t for _, t in tokens)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": self.finish, "stop_reason": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": []}
        else:
            choice["text"] = text
        return self._envelope([self._ids(choice, tokens)], chunk=False, usage=self.usage())

    def chunk(self, tokens: list[tuple[int, str]], *, finish: bool = False, role: bool = False) -> dict[str, Any]:
        """A streamed chunk of `tokens`; `role`: the chat stream's opening one, `finish`: its last."""
        text = "".join(t for _, t in tokens)
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": self.finish if finish else None}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": ""} if role else {"content": text}
        else:
            choice |= {"text": text, "stop_reason": None}
        return self._envelope([self._ids(choice, tokens)])

    def _ids(self, choice: dict[str, Any], tokens: list[tuple[int, str]]) -> dict[str, Any]:
        return choice | {"token_ids": [i for i, _ in tokens]} if self.token_ids else choice

    def usage_chunk(self) -> dict[str, Any]:
        return self._envelope([], usage=self.usage())

    def _envelope(self, choices: list[dict[str, Any]], *, chunk: bool = True, **extra: Any) -> dict[str, Any]:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices,
                **extra}


def render_metrics(engine: Engine, model: str) -> str:
    m, labels = engine.metrics, f'engine="0",model_name="{model}"'
    lines: list[str] = []

    def emit(name: str, kind: str, value: float, extra: str = "") -> None:
        if not any(line.startswith(f"# TYPE {name} ") for line in lines):
            lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{{{labels}{extra}}} {float(value)}")

    emit("vllm:num_requests_running", "gauge", m.requests_running)
    emit("vllm:num_requests_waiting", "gauge", m.requests_waiting)
    emit("vllm:kv_cache_usage_perc", "gauge", min(1.0, engine.kv_used / max(engine.kv_capacity, 1)))
    lines += _cache_config(engine)
    asleep = engine.asleep
    for state, value in (("awake", not asleep), ("weights_offloaded", asleep and engine.level == 1),
                         ("discard_all", asleep and engine.level == 2)):
        emit("vllm:engine_sleep_state", "gauge", value, f',sleep_state="{state}"')
    emit("sparkctl_sim_memory_bytes", "gauge", engine.memory.held())
    emit("vllm:prompt_tokens_total", "counter", m.prompt_tokens)
    emit("vllm:generation_tokens_total", "counter", m.generation_tokens)
    emit("vllm:prefix_cache_queries_total", "counter", m.prefix_queries)
    emit("vllm:prefix_cache_hits_total", "counter", m.prefix_hits)
    for phase, seconds in m.engine_s.items():
        emit("sparkctl_sim_engine_seconds_total", "counter", seconds, f',phase="{phase}"')
    emit("vllm:request_success_total", "counter", m.requests_finished, ',finished_reason="length"')
    if engine.num_speculative:
        emit("vllm:spec_decode_num_drafts_total", "counter", m.drafts)
        emit("vllm:spec_decode_num_draft_tokens_total", "counter", m.draft_tokens)
        emit("vllm:spec_decode_num_accepted_tokens_total", "counter", m.accepted_tokens)
        for pos, count in enumerate(m.accepted_per_pos):
            emit("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", count, f',position="{pos}"')
    if engine.profile.block > 1:
        emit("vllm:diffusion_num_committed_tokens", "counter", m.diffusion_committed)
        emit("vllm:diffusion_num_denoising_steps", "counter", m.diffusion_steps)
        emit("vllm:diffusion_num_canvas_positions", "counter", m.diffusion_canvas)
    _histogram(lines, "vllm:time_to_first_token_seconds", m.ttft, labels)
    _histogram(lines, "vllm:inter_token_latency_seconds", m.itl, labels)
    return "\n".join(lines) + "\n"


def _cache_config(engine: Engine) -> list[str]:
    """vLLM's info gauge of its cache config (no model_name label): the KV capacity in whole
    blocks, without the `kv_cache_size_tokens` label that vLLM 0.24 has and 0.20 has not."""
    labels = {"block_size": KV_BLOCK_SIZE, "engine": 0, "gpu_memory_utilization": engine.memory_fraction,
              "num_gpu_blocks": engine.kv_capacity // KV_BLOCK_SIZE}
    shown = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return ["# TYPE vllm:cache_config_info gauge", f"vllm:cache_config_info{{{shown}}} 1.0"]


def _histogram(lines: list[str], name: str, h: Histogram, labels: str) -> None:
    lines.append(f"# TYPE {name} histogram")
    counts = h.counts or [0] * len(h.buckets)
    for bound, count in zip(h.buckets, counts, strict=True):
        lines.append(f'{name}_bucket{{{labels},le="{bound}"}} {float(count)}')
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(h.n)}')
    lines.append(f"{name}_count{{{labels}}} {float(h.n)}")
    lines.append(f"{name}_sum{{{labels}}} {h.total}")


@web.middleware
async def _access(request: web.Request, handler: Any) -> web.StreamResponse:
    """uvicorn's access line, as vLLM logs it, for each request that is not a GET (the health and
    metrics polls would drown the log here, where they come every second)."""
    response = await handler(request)
    if request.method != "GET":
        peer = request.transport.get_extra_info("peername") if request.transport else None
        where = f"{peer[0]}:{peer[1]}" if peer else "-"
        log(f'{where} - "{request.method} {request.path_qs} HTTP/{request.version.major}.{request.version.minor}" '
            f"{response.status}")
    return response


async def _json(request: web.Request) -> dict | web.Response:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(400, "request body is not valid JSON", "BadRequestError")
    return body if isinstance(body, dict) else _error(400, "request body must be a JSON object", "BadRequestError")


def _echo(body: dict) -> dict[str, str]:
    """The request's `chat_template_kwargs` as the sim received them, in a response header: real
    vLLM hands them to the chat template, which the sim has none of, so this is how a test sees
    what reached the engine (e.g. the gateway's request defaults)."""
    kwargs = body.get("chat_template_kwargs")
    if kwargs is None:
        return {}
    return {"X-Sim-Chat-Template-Kwargs": json.dumps(kwargs, sort_keys=True, separators=(",", ":"))}


def _content(content: Any) -> str:
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...], joined by newlines as vLLM joins them
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _error(status: int, message: str, kind: str, *, param: str | None = None) -> web.Response:
    error = {"message": message, "type": kind, "param": param, "code": status}
    return web.json_response({"error": error}, status=status)


async def _send(response: web.StreamResponse, data: dict[str, Any]) -> None:
    await response.write(b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n")
