"""The sentinel's and the hang watch's figures (docs/design.md, "Unified memory safety"), each
printed beside its goal:

- from an `NVRM: ... NV_ERR_NO_MEMORY` line appended to the kernel log the daemon reads (a file
  here; /dev/kmsg on a Spark) to the newest engine's container no longer running; goal <= 1 s;
- from the last token a deadlocked sim engine streamed to its removal from routing (the daemon's
  `engine_hung` line, logged as it ejects the engine), against the bound SPARKCTL_HANG_AFTER;
  goal <= the bound + 2 s;
- the daemon idle with three stacks running and the sentinel on, reading the real /dev/kmsg (this
  machine's user may: root): CPU over windows of 30 s, and RSS after them; goals <= 1 % and
  <= 100 MB. The same daemon with the sentinel off is the control.

Run with `make perf` (or `.venv/bin/python tests/perf/bench_sentinel.py`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SPARKCTL, figure, idle_cpu, load, runs, sparkctl, spread, wait, world  # noqa: E402

from sparkctl.instance import container_name  # noqa: E402
from tests.teardown import stop  # noqa: E402

STOPS, HANGS, IDLE_S, IDLE_WINDOWS = runs(5), runs(3), runs(30, smoke=3), runs(5)
HANG_AFTER = 5.0
THREE = ("bench-a", "bench-b", "bench-c")
NVRM = "3,{seq},{usec},-;NVRM: _memdescAllocInternal: nvAssertFailedNoLog: Assertion failed: NV_ERR_NO_MEMORY\n"


def running(name: str) -> bool:
    done = subprocess.run(["docker", "inspect", "-f", "{{.State.Status}}", name], capture_output=True, text=True)
    return done.stdout.strip() == "running"


class Daemon:
    """`sparkctl daemon` with its JSON log in a file, for the lines the figures are read from."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen([SPARKCTL, "daemon"], env=env, stdout=out, stderr=subprocess.STDOUT)
        wait(lambda: (Path(env["SPARKCTL_STATE_DIR"]) / "sparkctl.sock").exists(), timeout=60)
        time.sleep(0.5)

    def events(self, event: str) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if f'"event": "{event}"' in line]

    def stop(self) -> None:
        stop(self.proc, 30)


def stops(env: dict[str, str], kmsg: Path) -> list[float]:
    """NVRM line -> the newest engine killed, STOPS times (the sentinel settles 5 s between acts)."""
    name = container_name("bench-a", env["SPARKCTL_INSTANCE"])
    took = []
    for i in range(STOPS):
        sparkctl(env, "wake", "bench-a") if i else sparkctl(env, "up", "bench-a")
        wait(lambda: running(name))  # noqa: B023
        time.sleep(6)  # past the sentinel's settling time after its previous stop
        with kmsg.open("a") as f:
            f.write(NVRM.format(seq=1000 + i, usec=int(time.monotonic() * 1e6)))
            f.flush()
            written = time.monotonic()
        wait(lambda: not running(name), timeout=30)  # noqa: B023
        took.append(time.monotonic() - written)
    return took


def hangs(env: dict[str, str], daemon: Daemon) -> list[float]:
    """A sim engine that deadlocks after 3 requests, fed streamed requests one after another: the
    time from the last token it streamed to the `engine_hung` line, HANGS times."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{env['SPARKCTL_GATEWAY_PORT']}/v1", api_key="x",
                           max_retries=0, timeout=120)
    sparkctl(env, "up", "bench-hang")
    delays = []
    for i in range(HANGS):
        wait(lambda: len(daemon.events("engine_routed_again")) >= i, timeout=120)  # noqa: B023
        tokens: list[float] = []
        while len(daemon.events("engine_hung")) <= i:
            try:
                for _ in client.chat.completions.create(model="bench-hang", stream=True, max_tokens=16,
                                                        messages=[{"role": "user", "content": "go"}]):
                    tokens.append(time.time())
            except openai.OpenAIError:
                pass  # the stream the ejection ended
        hung = daemon.events("engine_hung")[i]
        at = dt.datetime.fromisoformat(hung["timestamp"].replace("Z", "+00:00")).timestamp()
        delays.append(at - max(t for t in tokens if t <= at))
    return delays


def idle(env: dict[str, str], log: Path, *, sentinel: bool) -> tuple[list[float], float]:
    """The daemon's CPU % over each idle window with THREE running, and its RSS (MB) after them."""
    daemon = Daemon(env | {"SPARKCTL_SENTINEL": "1" if sentinel else "0", "SPARKCTL_KERNEL_LOG": "auto"}, log)
    try:
        for stack in THREE:
            sparkctl(env, "up", stack)
        time.sleep(5)
        percents, rss = idle_cpu(daemon.proc.pid, windows=IDLE_WINDOWS, seconds=IDLE_S)
        watching = daemon.events("sentinel_watching")
        assert not sentinel or (watching and watching[0]["kernel_log"] == "/dev/kmsg"), watching
    finally:
        daemon.stop()
    return percents, rss


def main() -> None:
    print(load())
    with world() as (env, _hub):
        root = Path(env["PERF_ROOT"])
        for i, name in enumerate(THREE):
            (root / "stacks" / f"{name}.yaml").write_text(
                f"name: {name}\nextends: qwen36-nvfp4-stock\nvllm:\n  port: {8181 + i}\n"
                "resources:\n  gpu_memory_utilization: 0.2\n")
        (root / "stacks" / "bench-hang.yaml").write_text(
            "name: bench-hang\nextends: qwen36-nvfp4-stock\nvllm:\n  port: 8185\nresources:\n"
            "  gpu_memory_utilization: 0.2\ncontainer:\n  env:\n    SPARKCTL_SIM_FAULTS: deadlock_after=3\n")
        kmsg, meminfo = root / "kmsg", root / "meminfo"
        kmsg.touch()
        meminfo.write_text(Path("/proc/meminfo").read_text())  # still: the machine's own must not make it act
        env |= {"SPARKCTL_KERNEL_LOG": str(kmsg), "SPARKCTL_MEMINFO_PATH": str(meminfo),
                "SPARKCTL_HANG_AFTER": str(HANG_AFTER)}
        daemon = Daemon(env, root / "daemon.log")
        try:
            stopped = stops(env, kmsg)
            hung = hangs(env, daemon)
            for stack in ("bench-a", "bench-hang"):
                sparkctl(env, "down", stack)
        finally:
            daemon.stop()
        cpu_on, rss_on = idle(env, root / "idle-on.log", sentinel=True)
        cpu_off, rss_off = idle(env, root / "idle-off.log", sentinel=False)
    print(f"NVRM line -> the newest engine stopped: {spread(stopped)}; goal <= 1.000 s")
    print(f"last token of a deadlocked engine -> out of routing (SPARKCTL_HANG_AFTER {HANG_AFTER:g} s): "
          f"{spread(hung)}; goal <= {HANG_AFTER + 2:.3f} s")
    print(f"daemon idle with 3 stacks running, sentinel on (/dev/kmsg; windows of {IDLE_S} s): CPU "
          f"{spread(cpu_on, unit='%', digits=2)}, RSS {rss_on:.0f} MB; goals <= 1 % and <= 100 MB")
    print(f"the same, sentinel off (control): CPU {spread(cpu_off, unit='%', digits=2)}, RSS {rss_off:.0f} MB")
    figure("NVRM line to engine stopped", statistics.median(stopped), "s", sane=(0.001, 30))
    figure("last token to out of routing", statistics.median(hung), "s", sane=(HANG_AFTER - 1, HANG_AFTER + 60))
    figure("daemon idle CPU, sentinel on", statistics.median(cpu_on), "%", sane=(0, 100 * (os.cpu_count() or 1)))
    figure("daemon idle CPU, sentinel off", statistics.median(cpu_off), "%", sane=(0, 100 * (os.cpu_count() or 1)))
    figure("daemon RSS, sentinel on", rss_on, "MB", sane=(10, 4000))


if __name__ == "__main__":
    main()
