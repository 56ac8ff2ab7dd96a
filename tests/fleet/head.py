"""The fleet's head as the failover test and bench drive it: `sparkctl daemon` on host a with its
gateway on a's address (`HeadDaemon`, whose JSON log is read back for its fleet events), and
client loops through that gateway with the official `openai` client (`Load`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from openai import OpenAI

from sparkctl.deploy.health import http_status
from tests.fleet.cluster import Cluster


class HeadDaemon:
    """`sparkctl daemon` on host a, its gateway on a's address."""

    def __init__(self, cluster: Cluster, *, port: int) -> None:
        a = cluster.hosts["a"]
        self.url = f"http://{a.address}:{port}"
        self.log_path = cluster.root / "daemon.log"
        env = cluster.env_for(a) | {"SPARKCTL_GATEWAY_HOST": a.address, "SPARKCTL_GATEWAY_PORT": str(port),
                                    "SPARKCTL_SWITCH_HOLD_TIMEOUT": "150"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([*a.enter(), sys.executable, "-m", "sparkctl", "daemon"], stdout=log,
                                         stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 30
        while http_status(self.url + "/health") != 200:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log()[-3000:]
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self, name: str) -> list[dict]:
        found = []
        for line in self.log().splitlines():
            if f'"{name}"' in line:
                try:
                    found.append(json.loads(line[line.index("{"):]))
                except ValueError:
                    continue
        return found

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Load:
    """One client loop per stack through the gateway, sequential requests, no retries."""

    def __init__(self, url: str, stacks: list[str]) -> None:
        self.client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=180)
        self.ok = {s: 0 for s in stacks}
        self.failed: dict[str, list[str]] = {s: [] for s in stacks}
        self.failed_at: dict[str, list[float]] = {s: [] for s in stacks}  # epoch seconds, as `failed`
        self.slowest = {s: 0.0 for s in stacks}
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(s,), daemon=True) for s in stacks]
        for thread in self.threads:
            thread.start()

    def _loop(self, stack: str) -> None:
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                self.client.chat.completions.create(model=stack, max_tokens=4,
                                                    messages=[{"role": "user", "content": "hi"}])
                self.ok[stack] += 1
            except Exception as e:  # noqa: BLE001 - every failure is counted, with its reason
                self.failed[stack].append(f"{type(e).__name__}: {e}"[:300])
                self.failed_at[stack].append(time.time())
            self.slowest[stack] = max(self.slowest[stack], time.monotonic() - began)
            time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=200)
