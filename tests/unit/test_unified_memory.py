"""GB10's unified memory (issue 46, parts 1 and 2): the KV cache planned in bytes, the usable
memory asked of CUDA (a CUDA driver library of the test's own making stands for the GPU's), the
shared memory a stack's own /dev/shm takes, and the rules under which an engine may sleep."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sparkctl.adapters.cuda import free_memory
from sparkctl.deploy.memory import GIB, USABLE, MemoryView, kv_plan, meminfo, size_bytes, usable_memory
from sparkctl.errors import SparkctlError
from sparkctl.policy.parking import kv_budget, sleep_refusal
from sparkctl.settings import Settings
from sparkctl.spec.models import Stack
from sparkctl.spec.render import additions, vllm_args

LIMIT = 32 * GIB

FAKE_CUDA = r"""
#include <stddef.h>
int cuInit(unsigned flags) { return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void **context, int device) { *context = (void *)16; return 0; }
int cuCtxSetCurrent(void *context) { return context == (void *)16 ? 0 : 201; }
int cuMemGetInfo_v2(size_t *free, size_t *total) { *free = FREE; *total = TOTAL; return 0; }
int cuDevicePrimaryCtxRelease_v2(int device) { return 0; }
"""


def stack(**fields: object) -> Stack:
    return Stack.model_validate({"name": "s", "image": {"repository": "img", "tag": "1"},
                                 "model": {"path": "/models/s"}, "vllm": {}} | fields)


@pytest.fixture
def libcuda(tmp_path: Path) -> str:
    """A CUDA driver library that reports 102 GiB free of 121.7 (what two Sparks report at boot)."""
    source = tmp_path / "cuda.c"
    source.write_text(FAKE_CUDA)
    library = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-DFREE={102 * GIB}UL", f"-DTOTAL={int(121.7 * GIB)}UL",
                    "-o", str(library), str(source)], check=True)
    return str(library)


@pytest.mark.parametrize(("kv", "sleeping", "why"), [
    (20 * GIB, (), None),
    (LIMIT, (), None),
    (LIMIT + 1, (), "over the safe bound 32.0 GiB"),
    (78 * GIB, (), "re-map its 78.0 GiB KV region"),
    (None, (), "not bounded"),
    (20 * GIB, ("other",), "other sleeps already"),
    (20 * GIB, ("s",), None),  # itself, recorded parked while it parks
])
def test_an_engine_sleeps_only_with_a_bounded_kv_region_and_no_other_sleeper(kv, sleeping, why) -> None:
    refusal = sleep_refusal("s", kv_bytes=kv, kv_limit=LIMIT, sleeping=sleeping)
    assert (refusal is None) if why is None else (refusal is not None and why in refusal and
                                                  refusal.startswith("stop: "))


def test_the_kv_cache_is_the_fraction_less_the_weights_and_overhead() -> None:
    assert kv_budget(0.8, usable=100 * GIB, weights=26 * GIB, overhead=4 * GIB) == 50 * GIB
    settings = Settings(engine_overhead_gib=4)
    assert kv_plan(stack(), settings, weights=26 * GIB, usable=100 * GIB) == 50 * GIB
    # a multi-node rank holds its share of the weights
    group = stack(parallel={"nodes": 2, "tensor": 2})
    assert kv_plan(group, settings, weights=26 * GIB, usable=100 * GIB) == 63 * GIB
    assert kv_plan(stack(resources={"kv_cache": "engine"}), settings, weights=0, usable=100 * GIB) is None
    with pytest.raises(SparkctlError, match="leaves its engine no KV cache.*raise resources.gpu_memory_utilization"):
        kv_plan(stack(resources={"gpu_memory_utilization": 0.2}), settings, weights=26 * GIB, usable=100 * GIB)


def test_the_planned_kv_size_is_sparkctls_addition_and_sleep_mode_goes_with_the_rules() -> None:
    s = stack()
    args = vllm_args(s, kv_cache_bytes=40 * GIB)
    assert f"--kv-cache-memory-bytes={40 * GIB}" in args and "--enable-sleep-mode" in args
    added = dict(additions(s, True, 40 * GIB))
    assert "vLLM #46307" in added[f"--kv-cache-memory-bytes={40 * GIB}"]
    refused = vllm_args(s, sleep=False, kv_cache_bytes=40 * GIB)  # what a refused stack runs
    assert "--enable-sleep-mode" not in refused
    assert additions(s, False, None) == []  # the seed's command, nothing of sparkctl's
    assert not any(a.startswith("--kv-cache-memory-bytes") for a in vllm_args(s))


def test_usable_memory_is_cudas_free_memory_kept_for_starts_beside_running_engines(tmp_path, libcuda) -> None:
    settings = Settings(state_dir=tmp_path / "state", cuda_library=libcuda)
    total = meminfo("MemTotal")
    assert free_memory(libcuda) == 102 * GIB
    assert usable_memory(settings, engines_running=False) == min(102 * GIB, total)  # measured, and kept
    assert (tmp_path / "state" / USABLE).is_file()
    gone = Settings(state_dir=tmp_path / "state", cuda_library=str(tmp_path / "none.so"))
    assert usable_memory(gone, engines_running=True) == min(102 * GIB, total)  # engines run: the kept figure
    assert Settings(memory_total_gib=50, cuda_library=libcuda).memory_total_gib == 50
    assert usable_memory(Settings(memory_total_gib=50, state_dir=tmp_path), engines_running=False) == 50 * GIB


def test_without_cuda_the_usable_memory_is_memtotal(tmp_path) -> None:
    assert free_memory(str(tmp_path / "libcuda.so.1")) is None
    settings = Settings(state_dir=tmp_path, cuda_library=str(tmp_path / "libcuda.so.1"))
    assert usable_memory(settings, engines_running=False) == meminfo("MemTotal")
    assert not (tmp_path / USABLE).exists()


def test_a_stacks_own_shm_counts_and_the_hosts_is_not_docker_s_to_size() -> None:
    view = MemoryView(Settings(), store=None, catalog=None, docker=None)  # type: ignore[arg-type]
    assert view.shm(stack(container={"ipc": "private", "shm_size": "16g"})) == 16 * GIB
    assert view.shm(stack(container={"ipc": "host", "shm_size": "16g"})) == 0  # Docker ignores it with ipc: host
    assert view.shm(stack(container={"ipc": "shareable"})) == 16 * GIB  # Docker's size for it: the default
    assert [size_bytes(s) for s in ("16g", "1.5g", "512m", "1024")] == [16 * GIB, int(1.5 * GIB), 512 << 20, 1024]
