"""A replica put to sleep behind the gateway without the daemon's word (`POST /sleep` on the
engine itself): the engine answers 503 while asleep, and the gateway takes it out of routing and
sends its requests to the other replica, so under a loop of the official openai client, streamed
and not, no request fails; once woken the engine is back in routing and serves again.

Against two sim engine processes in dev mode (what a cheaper test cannot show: the engine's own
sleep, its answers while asleep and its requests cut by the sleep, through real clients)."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running, wait_for

CLIENTS = 3


def served(url: str) -> int:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return int(sum(float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)", text, re.M)))


def post(url: str) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, b"", method="POST"), timeout=60) as answer:
        return json.loads(answer.read())


class Loop:
    """CLIENTS threads sending completions back to back, every other one streamed, until stopped."""

    def __init__(self, url: str) -> None:
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        self.done, self.failures, self.lock = 0, [], threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(CLIENTS)]
        for thread in self.threads:
            thread.start()

    def _client(self, i: int) -> None:
        streamed = bool(i % 2)
        while not self.stopping.is_set():
            streamed = not streamed
            try:
                if streamed:
                    chunks = list(self.client.completions.create(model="tiny", prompt="x", max_tokens=6,
                                                                 stream=True, extra_body={"ignore_eos": True}))
                    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "abort"), chunks[-1]
                else:
                    reply = self.client.completions.create(model="tiny", prompt="x", max_tokens=6,
                                                           extra_body={"ignore_eos": True})
                    assert reply.choices[0].finish_reason in ("length", "abort"), reply  # abort: cut by the sleep
                with self.lock:
                    self.done += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with self.lock:
                    self.failures.append(f"{type(e).__name__}: {e}"[:300])

    def after(self, more: int) -> None:
        """Wait until `more` requests have finished from now (failed ones fail the wait)."""
        target = self.done + more
        wait_for(lambda: self.done >= target or self.failures, timeout=60, what=f"{more} more requests")
        assert not self.failures, self.failures

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)


@pytest.fixture
def replicas(sim) -> Iterator[tuple[Running, list]]:
    engines = [sim("--sim-profile", "aeon-gemma4-v2", "--enable-sleep-mode", env={"VLLM_SERVER_DEV_MODE": "1"})
               for _ in range(2)]
    for engine in engines:
        engine.wait_ready()
    table = RouteTable({"gemma": Upstream("gemma", engines[0].url, "tiny", replicas=(engines[1].url,))})
    running = Running(Gateway(lambda: table))
    yield running, engines
    running.stop()


def test_a_replica_put_to_sleep_fails_no_request_and_serves_again_once_woken(replicas) -> None:
    running, (sleeper, other) = replicas
    running.loop.call_soon_threadsafe(setattr, running.gateway.replicas, "eject_s", 1.0)  # back sooner
    loop = Loop(running.url)
    try:
        loop.after(10)
        assert post(sleeper.url + "/sleep?level=1") == {"status": "sleeping", "level": 1}
        asleep_at = served(sleeper.url)
        loop.after(40)  # several ejections of the sleeper run out meanwhile: each sends it a request again
        assert served(sleeper.url) == asleep_at and served(other.url) > 0
        assert post(sleeper.url + "/wake_up")["status"] == "awake"
        wait_for(lambda: served(sleeper.url) > asleep_at + 3 or loop.failures, timeout=60, what="the woken replica")
        loop.after(5)
    finally:
        loop.stop()
    assert loop.failures == [], loop.failures
