"""An engine's HTTP API as sparkctl calls it: health, models, metrics, a chat completion (the
canary, the fleet's probe) and vLLM's sleep-mode dev endpoints (`adapters/sleepmode.py`). The
only module that speaks HTTP to engines. Every call goes straight to the engine, never through a
proxy the environment names (engines listen on loopback or on the fleet's serving network), and
is bounded by its timeout. Standard library only: the benchmark's scraper runs it after each
test run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def call(url: str, path: str = "", *, body: Any = None, method: str | None = None,
         headers: dict[str, str] | None = None, timeout: float) -> tuple[int, bytes]:
    """The status and body of one request (`body`: sent as JSON); an HTTP error status is an
    answer too. OSError when nothing answers within `timeout` (refused, reset, timed out)."""
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Content-Type": "application/json"} if data is not None else {}
    request = urllib.request.Request(url + path, data=data, method=method, headers=sent | (headers or {}))
    try:
        with DIRECT.open(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def text(url: str, path: str = "", *, headers: dict[str, str] | None = None, timeout: float) -> str:
    """The body of a GET that answers 200, as text (`/metrics`); OSError for anything else."""
    status, body = call(url, path, headers=headers, timeout=timeout)
    if status != 200:
        raise OSError(f"GET {url}{path} answered HTTP {status}")
    return body.decode(errors="replace")


def status(url: str, path: str = "", *, headers: dict[str, str] | None = None, timeout: float = 5) -> int | None:
    """The status of a GET (`/health`), or None while nothing answers."""
    try:
        return call(url, path, headers=headers, timeout=timeout)[0]
    except OSError:
        return None


def models(url: str, *, timeout: float) -> list[dict[str, Any]]:
    """The model cards `/v1/models` lists; OSError or ValueError when it does not answer with them."""
    cards = json.loads(text(url, "/v1/models", timeout=timeout)).get("data")
    if not isinstance(cards, list):
        raise ValueError(f"{url}/v1/models lists no models")
    return [card for card in cards if isinstance(card, dict)]
