"""The GPU's free memory as CUDA reports it, asked of the CUDA driver library (`cuMemGetInfo`).

On a DGX Spark the GPU and the CPU share one pool, and CUDA's free memory at boot is well under
MemTotal (about 102 of 121.7 GiB on two Sparks, whatever the driver): that, not MemTotal, is the
memory engines can be given. `deploy/memory.py` asks once and keeps the figure. Without the
library (no NVIDIA driver) or when a call fails, the answer is None. Stdlib only (ctypes).
"""

from __future__ import annotations

import ctypes


def free_memory(library: str) -> int | None:
    """Bytes free on device 0, through the device's primary context (retained only for the call,
    so no memory stays held by this process); None when CUDA cannot say."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return None
    device, context = ctypes.c_int(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    try:
        if cuda.cuInit(0) or cuda.cuDeviceGet(ctypes.byref(device), 0):
            return None
        if cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device):
            return None
        try:
            if cuda.cuCtxSetCurrent(context) or cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)):
                return None
        finally:
            cuda.cuDevicePrimaryCtxRelease_v2(device)
    except AttributeError:  # not a CUDA driver library after all
        return None
    return free.value
