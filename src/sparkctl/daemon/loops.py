"""The daemon's two threads: the reconcile loop (a pass when kicked, when a backoff ends, and
every resync interval) and the Docker event watcher (deaths and OOM kills of this instance's
containers; reconnects with backoff, and resyncs after). Built and started by `daemon/app.py`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from sparkctl import instance as instances
from sparkctl.adapters.docker import DockerEngine
from sparkctl.container import LABEL_STACK
from sparkctl.daemon import process
from sparkctl.daemon.reconciler import Reconciler
from sparkctl.state.store import Store

log = structlog.get_logger()


class Loops:
    def __init__(self, *, reconciler: Reconciler, docker: DockerEngine, store: Callable[[], Store], instance: str,
                 resync: float, after_pass: Callable[[], None]) -> None:
        self.reconciler, self.docker, self.store, self.instance = reconciler, docker, store, instance
        self.resync, self.after_pass = resync, after_pass  # after a pass: rebuild the gateway's routes
        self.stopping = threading.Event()
        self._kick = threading.Event()
        self._oom: set[str] = set()
        self._events_stream: Any = None  # the open Docker event stream, closed on shutdown

    def kick(self) -> None:
        self._kick.set()

    def start(self) -> None:
        for target, name in ((self.watch_events, "events"), (self.reconcile_forever, "reconcile")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        self.stopping.set()
        self.kick()
        if self._events_stream is not None:
            self._events_stream.close()

    def reconcile_forever(self) -> None:
        while not self.stopping.is_set():
            wake = self.reconciler.wake_at
            timeout = self.resync if wake is None else max(0.0, min(self.resync, wake - time.time()))
            self._kick.wait(timeout)
            self._kick.clear()
            if self.stopping.is_set():
                return
            try:
                self.reconciler.reconcile()
                self.after_pass()
            except Exception as e:  # noqa: BLE001 - the loop must outlive any one bad pass
                log.error("reconcile_failed", error=f"{type(e).__name__}: {e}".splitlines()[0][:300])
                self.stopping.wait(1.0)
                self.kick()  # try again: the resync must not wait a whole interval after a failure
            process.give_back_memory()

    def watch_events(self) -> None:
        """Docker events (die, oom, start, destroy) of our containers; reconnects with backoff."""
        delay = 0.5
        while not self.stopping.is_set():
            try:
                stream = self.docker.client.events(decode=True, filters={"type": "container", "label": LABEL_STACK})
                self._events_stream = stream
                log.info("docker_events_connected")
                delay = 0.5
                self.kick()  # resync: events may have been missed while disconnected
                for event in stream:
                    self.on_event(event)
            except Exception as e:  # noqa: BLE001 - the engine went away: back off and reconnect
                if self.stopping.is_set():
                    return
                log.warning("docker_events_lost", error=f"{type(e).__name__}: {e}"[:200], retry_in=delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, 10.0)

    def on_event(self, event: dict[str, Any]) -> None:
        """One Docker event: a death counts towards the crash-loop rule; any change asks for a pass."""
        action = event.get("Action", "")
        attributes = event.get("Actor", {}).get("Attributes", {})
        if not instances.owned(attributes, self.instance):
            return  # another instance's container: its own daemon handles it
        stack, container = attributes.get(LABEL_STACK), event.get("id", "")
        if action == "oom":
            self._oom.add(container)
        elif action == "die" and stack:
            code = attributes.get("exitCode")
            oom = container in self._oom
            self._oom.discard(container)
            if self.reconciler.died(stack, oom=oom, exit_code=int(code) if code else None):
                self.store().record_event(stack, "died", "OOM-killed" if oom else f"exit code {code}")
            self.kick()
        elif action in ("destroy", "stop"):
            self.kick()
