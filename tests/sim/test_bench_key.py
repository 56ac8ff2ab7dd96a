"""The gateway's API key never shows on a command line during a benchmark (issue 45, low): it was
passed to llama-benchy as `--api-key`, which every local user can read (`ps`, /proc/PID/cmdline).
A real llama-benchy run through a keyed gateway, in front of the simulated engine: the run gets
through (a keyless llama-benchy would get 401s), while every process of the run is watched and
none carries the key on its command line, nor in the run's command.txt."""

from __future__ import annotations

import threading
from pathlib import Path

from sparkctl.bench import runner
from sparkctl.bench.profiles import Profile
from sparkctl.gateway.proxy import Gateway
from sparkctl.gateway.routes import RouteTable, Upstream
from tests.conftest import Running

KEY = "sk-bench-secret-9f3c"


def command_lines() -> dict[int, str]:
    """Every process's command line, as `ps` shows it to any local user."""
    lines = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
    return lines


def test_a_benchmark_through_a_keyed_gateway_never_puts_the_key_on_a_command_line(sim, tiny_model, tmp_path) -> None:
    engine = sim("--sim-profile", "aeon-gemma4-v2", scale=0.01)
    engine.wait_ready()
    table = RouteTable(upstreams={"gemma": Upstream("gemma", engine.url, "tiny")}, aliases={"primary": "gemma"})
    gateway = Running(Gateway(lambda: table, api_keys=[KEY]))
    seen: dict[int, str] = {}
    done = threading.Event()

    def watch() -> None:  # the run's processes, as they come and go
        while not done.wait(0.02):
            seen.update({pid: line for pid, line in command_lines().items() if "llama" in line and "bench" in line})

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        target = runner.Target(gateway.url + "/v1", "primary", tiny_model, api_key=KEY)
        rows = runner.run(target, Profile("key", 64, 16, (0,), runs=1), folder=tmp_path / "run",
                          method=runner.Method(corpus="loopback", skip_coherence=True), timeout=300)
    finally:
        done.set()
        watcher.join(5)
        gateway.stop()
    assert [(r.depth, r.failed) for r in rows] == [(0, False)] and rows[0].tg_tps > 0
    assert seen, "the watcher saw no llama-benchy process"
    assert not [line for line in seen.values() if KEY in line], seen
    assert KEY not in (tmp_path / "run" / "command.txt").read_text()
