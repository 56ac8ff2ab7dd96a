"""What the switch and parking tests share: the agents on the gateway (an agent loop and a
32-way loop, every answer recorded with the stack that served it) and the calls they make."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import openai
from ruamel.yaml import YAML

from tests.conftest import wait_for

A, B = "qwen36-dflash", "aeon-gemma4-v2"
STACK_OF = {"qwen36-dflash": A, "aeon-gemma4": B}  # served name -> stack
FAST_LOAD = "SPARKCTL_SIM_TIME_SCALE=0.01,SPARKCTL_SIM_LOAD_SCALE=0.002"
TOOLS = [{"type": "function", "function": {
    "name": f"tool_{i}", "description": "Reads a file of the workspace and returns its lines. " * 3,
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "start": {"type": "integer"}},
                   "required": ["path"]}}} for i in range(8)]


@dataclass
class Answer:
    sent: float
    received: float
    stack: str | None
    error: str | None = None


@dataclass
class Load:
    """An agent loop (sequential chat calls with tool-sized prompts) and `width` concurrent loops."""

    url: str
    width: int = 32
    answers: list[Answer] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self._agent)] + \
                       [threading.Thread(target=self._worker, args=(i,)) for i in range(self.width)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(120)

    def failures(self) -> list[Answer]:
        return [a for a in self.answers if a.error]

    def served_by(self, stack: str, *, since: int = 0, count: int | None = None, timeout: float = 60) -> int:
        """Wait until `count` answers (one per loop if not given) came from `stack` among those after
        the first `since`; a failed request ends the wait. Returns how many answers there are now."""
        wanted = self.width + 1 if count is None else count
        wait_for(lambda: sum(a.stack == stack for a in self.answers[since:]) >= wanted or self.failures(),
                 timeout, f"{wanted} answers from {stack}")
        return len(self.answers)

    def _agent(self) -> None:
        client = openai.OpenAI(base_url=self.url, api_key="x", max_retries=0, timeout=120)
        history = [{"role": "system", "content": "You are a coding agent. Use the tools."}]
        while not self.stopping.is_set():
            history.append({"role": "user", "content": "Open src/main.py and summarise lines 1-80 of it."})
            self._call(lambda: client.chat.completions.create(model="primary", messages=history[-6:], tools=TOOLS,
                                                               max_tokens=24))

    def _worker(self, index: int) -> None:
        client = openai.OpenAI(base_url=self.url, api_key="x", max_retries=0, timeout=120)
        while not self.stopping.is_set():
            self._call(lambda: client.completions.create(model="primary", prompt=f"worker {index}", max_tokens=8))

    def _call(self, request) -> None:
        sent = time.time()
        try:
            reply = request()
            self.answers.append(Answer(sent, time.time(), STACK_OF.get(reply.model, reply.model)))
        except openai.OpenAIError as e:
            self.answers.append(Answer(sent, time.time(), None, f"{type(e).__name__}: {e}"))


def amend(path, **keys: object) -> None:
    """Set top-level keys of a stack file (comments and the rest kept)."""
    yaml = YAML()
    data = yaml.load(path.read_text())
    data.update(keys)
    with path.open("w") as out:
        yaml.dump(data, out)


def routed(gateway: str, key: str | None = None) -> str | None:
    ask = urllib.request.Request(gateway + "/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        models = json.loads(urllib.request.urlopen(ask, timeout=5).read())["data"]
    except OSError:
        return None
    return next((STACK_OF.get(m["root"], m["root"]) for m in models if m["id"] == "primary"), None)


def switch(daemon, stack: str, alias: str = "primary") -> dict:
    *_, outcome = daemon.client.stream("/v1/switch", {"alias": alias, "stack": stack})
    return outcome


def switch_quietly(daemon, stack: str) -> None:
    """A switch whose daemon may be killed under it."""
    try:
        switch(daemon, stack)
    except (OSError, ValueError):
        pass


def kill_during_switches(daemon, start_daemon, *, points: int, seed: int, within: float, settled):
    """Switch `primary` back and forth, `kill -9` the daemon at a random moment of each switch,
    start it again and wait until `settled(daemon)`; returns the last daemon."""
    import os
    import random

    rng = random.Random(seed)
    for point in range(points):
        target = A if routed(daemon.gateway) == B else B
        worker = threading.Thread(target=switch_quietly, args=(daemon, target))
        worker.start()
        time.sleep(rng.uniform(0.0, within))  # the behaviour under test: a kill at a random moment of the switch
        daemon.kill9()
        worker.join(60)
        assert not worker.is_alive(), f"the switch's client did not return after its daemon was killed ({point})"
        daemon = start_daemon()
        daemon.gateway = f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"
        deadline = time.monotonic() + 60
        while not settled(daemon):
            assert time.monotonic() < deadline, f"not settled after kill point {point}\n{daemon.logs()[-4000:]}"
            time.sleep(0.1)
    return daemon

