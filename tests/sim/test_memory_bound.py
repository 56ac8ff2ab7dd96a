"""An engine's memory bounded by construction (issue 46, part 1): the simulated engine overshoots
during start-up profiling as vLLM did on a GB10 (vLLM #46307) when it sizes its KV cache from the
fraction, and stays inside its fraction with the absolute KV size sparkctl renders.

The sim holds real memory (SPARKCTL_SIM_MEMORY_SCALE), so its peak resident set (VmHWM) is what
the kernel saw, measured beside a sim that holds nothing."""

from __future__ import annotations

from pathlib import Path

from sparkctl.deploy.memory import kv_plan, meminfo
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.spec.render import vllm_args
from tests.fakes.tinymodel import write_model
from tests.sim.conftest import SimProcess

FRACTION = 0.3
MEMORY_SCALE = 0.02  # of this machine's MemTotal: the fraction is ~150 MB here
OVERSHOOT = 0.5  # profiling takes half the host beyond the fraction (#46307: 0.70 reached ~0.94)
STACK = Stack.model_validate({"name": "bounded", "image": {"repository": "sim", "tag": "1"},
                              "model": {"path": "/models/tiny"}, "vllm": {},
                              "resources": {"gpu_memory_utilization": FRACTION}, "switch": {"park": "stop"}})


def peak(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def start(model: Path, kv_cache_bytes: int | None, *, memory_scale: float = MEMORY_SCALE) -> int:
    """A sim run with the flags sparkctl renders for STACK; its peak resident set once it serves."""
    args = [a for a in vllm_args(STACK, kv_cache_bytes=kv_cache_bytes)
            if a not in ("--served-model-name", "bounded", "--host", "127.0.0.1", "--port", "8000")]
    engine = SimProcess(model, "--sim-profile", "aeon-gemma4-v2", *args, scale=0.01, load_scale=0.01,
                        env={"SPARKCTL_SIM_MEMORY_SCALE": repr(memory_scale),
                             "SPARKCTL_SIM_FAULTS": f"profile_overshoot={OVERSHOOT}"})
    try:
        engine.wait_ready()
        return peak(engine.proc.pid)
    finally:
        engine.stop()


def test_profiling_overshoots_the_fraction_and_the_planned_kv_size_stays_inside(tmp_path) -> None:
    model = write_model(tmp_path / "model", weights=False)
    (model / "model.safetensors").write_bytes(b"\x01" * (8 << 20))
    usable = int(meminfo("MemTotal") * MEMORY_SCALE)  # the Spark the sim's memory scale stands for
    kv = kv_plan(STACK, Settings(engine_overhead_gib=0), weights=8 << 20, usable=usable)
    assert kv is not None and f"--kv-cache-memory-bytes={kv}" in vllm_args(STACK, kv_cache_bytes=kv)

    base = start(model, None, memory_scale=0)  # the process alone: no memory held
    bound = FRACTION * usable
    planned = start(model, kv) - base
    unplanned = start(model, None) - base
    assert unplanned > bound + 0.5 * OVERSHOOT * usable, \
        f"without a KV size the sim's profiling should overshoot: {unplanned >> 20} MiB vs {bound / 2**20:.0f}"
    assert planned <= bound * 1.05, f"with the planned KV size it held {planned >> 20} MiB, over {bound / 2**20:.0f}"
