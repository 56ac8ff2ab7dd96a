"""vLLM's sleep mode, over the engine's HTTP dev endpoints (registered only with
VLLM_SERVER_DEV_MODE=1 and served on the engine's loopback port; the gateway never forwards them):
`POST /sleep?level=N`, `POST /wake_up`, `GET /is_sleeping`, `POST /collective_rpc` and
`POST /reset_prefix_cache`. Each call returns once the engine has done it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sparkctl.adapters import engine
from sparkctl.errors import SparkctlError


class SleepModeError(SparkctlError):
    """The engine refused or failed a sleep-mode call; the message has its answer."""


@dataclass(frozen=True)
class SleepMode:
    url: str  # the engine's base URL, e.g. http://127.0.0.1:8107
    timeout: float = 600.0  # a level-2 wake reloads the weights from disk

    def available(self) -> bool:
        """Whether the engine has the endpoints (it runs with sleep mode and dev mode)."""
        try:
            self.sleeping()
        except SleepModeError as e:
            if "HTTP 404" in str(e):
                return False
            raise
        return True

    def sleeping(self) -> bool:
        """vLLM answers after a sleep or wake under way (a level-2 reload takes seconds)."""
        answer = self._call("GET", "/is_sleeping", timeout=120).get("is_sleeping")
        if not isinstance(answer, bool):
            raise SleepModeError(f"GET /is_sleeping on {self.url}: no `is_sleeping` in the answer")
        return answer

    def sleep(self, level: int) -> None:
        self._call("POST", f"/sleep?level={level}")

    def wake(self, level: int) -> None:
        """Wake up. After level 2, in vLLM's documented order: map the weights, reload them from
        disk, then map the KV cache; and reset the prefix cache (built on the old memory)."""
        if level == 2:
            self._call("POST", "/wake_up?tags=weights")
            self._call("POST", "/collective_rpc", {"method": "reload_weights"})
            self._call("POST", "/wake_up?tags=kv_cache")
            self._call("POST", "/reset_prefix_cache")
        else:
            self._call("POST", "/wake_up")

    def warm_up(self, served_name: str) -> None:
        """One token, so the first real request meets a warm engine; and proof that the wake
        worked (a hybrid model's failed wake can leave /health green while completions hang)."""
        self._call("POST", "/v1/completions", {"model": served_name, "prompt": "Hi", "max_tokens": 1}, timeout=60)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
              timeout: float | None = None) -> dict[str, Any]:
        try:
            status, text = engine.call(self.url, path, body=body, method=method, timeout=timeout or self.timeout)
        except OSError as e:
            raise SleepModeError(f"{method} {path} on {self.url}: {getattr(e, 'reason', e)}") from None
        if status >= 400:
            detail = text[:300].decode(errors="replace").strip()
            raise SleepModeError(f"{method} {path} on {self.url}: HTTP {status} {detail}".rstrip())
        try:
            answer = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            answer = {}
        return answer if isinstance(answer, dict) else {}
