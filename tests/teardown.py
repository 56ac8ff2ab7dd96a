"""How a test, a fixture or a benchmark stops a process it started: SIGTERM, a bounded wait, then
SIGKILL, and the process reaped. A process slow to exit under load is killed, never a failure of
the run; the caller learns from the exit code whether it stopped on its own (a test about a clean
stop asserts that). Whatever a stopped process leaves behind (a namespace, a bridge, a grandchild)
is the sweeps' to remove: `tests.fleet.hosts.sweep` and the session's leftovers check
(`tests.leftovers`). For that, a run has an id (`run_id`): every process the run starts inherits
it in its environment, and the fleet harness names its namespaces and links after it.

Used by the fixtures under tests/ and by tests/perf/bench_*.py (which put the repository root on
sys.path). Stdlib only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

REAP_S = 10.0  # after SIGKILL: longer means the process is stuck in the kernel; the sweeps find it
RUN_ENV = "SPARKCTL_TEST_RUN"


def run_id() -> str:
    """This run's id (4 hex): the pytest session's, inherited by everything it starts (benchmarks
    too), or a benchmark's own when it runs alone. Set in the environment on first use."""
    return os.environ.setdefault(RUN_ENV, uuid.uuid4().hex[:4])


def stop(proc: subprocess.Popen, grace: float = 10.0) -> int | None:
    """Stop `proc`: SIGTERM, up to `grace` s to exit, then SIGKILL (`grace=0`: SIGKILL at once, for
    a test whose point is an abrupt death). Returns its exit code (negative: the signal that ended
    it), or None if it outlived SIGKILL by REAP_S s. Never raises."""
    if proc.poll() is not None:
        return proc.returncode
    if grace > 0:
        proc.terminate()
        try:
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            print(f"process {proc.pid} ({_command(proc)}) still ran {grace:g} s after SIGTERM; killed",
                  file=sys.stderr)
    proc.kill()
    try:
        return proc.wait(REAP_S)
    except subprocess.TimeoutExpired:
        print(f"process {proc.pid} ({_command(proc)}) outlived SIGKILL by {REAP_S:g} s; left to the sweep",
              file=sys.stderr)
        return None


def _command(proc: subprocess.Popen) -> str:
    args = proc.args if isinstance(proc.args, (list, tuple)) else [proc.args]
    return " ".join(map(str, args))[:200]
