"""Warning signs of a host wedge on unified memory, and of an engine that stopped generating:
pure judgements over what the sentinel (`daemon/sentinel.py`) reads each second. A kernel-log
line is an NVRM out-of-memory (`NVRM: ... NV_ERR_NO_MEMORY`, the line before the silent wedges of
open-gpu-kernel-modules #1358 and dgx-spark-playbooks #97) or an Xid; MemAvailable is judged by
its level and its slope; the engine stopped is the one that grew last; an engine is hung while
requests run and neither its generated nor its prompt tokens move (eugr/spark-vllm-docker #260).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

GIB = 1 << 30
MIB = 1 << 20
HORIZON = 5.0  # s: MemAvailable falling so fast it would cross the floor within this is a warning sign
SLOPE_OVER = 5.0  # s of samples the slope is measured over

_KMSG = re.compile(r"^\d+,\d+,\d+,[^;]*;")  # /dev/kmsg's record prefix: level,seq,usec,flags;
_XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")


class Sign(StrEnum):
    NVRM_OOM = "nvrm_oom"  # the driver could not allocate: the wedge's last line on GB10
    XID = "xid"  # a GPU error: recorded, and acted on only with memory low
    MEMORY_LOW = "memory_low"  # MemAvailable under the floor
    MEMORY_FALLING = "memory_falling"  # at this slope, under the floor within HORIZON

    @property
    def acts(self) -> bool:
        """Whether the sign alone makes the sentinel stop an engine (an Xid alone may be one
        request's fault, which vLLM survives)."""
        return self is not Sign.XID


@dataclass(frozen=True)
class Warning:
    sign: Sign
    detail: str  # the kernel line, or the figures that crossed


def kernel_line(text: str) -> Warning | None:
    """A kernel-log line (a /dev/kmsg record, a `journalctl -k` line, or a bare line) as a sign."""
    line = _KMSG.sub("", text.strip(), count=1)
    if "NVRM" in line and "NV_ERR_NO_MEMORY" in line:
        return Warning(Sign.NVRM_OOM, line[:300])
    if _XID.search(line):
        return Warning(Sign.XID, line[:300])
    return None


def memory(samples: Sequence[tuple[float, int]], *, floor: int) -> Warning | None:
    """Samples (time, MemAvailable bytes), oldest first: under the floor, or falling towards it."""
    if not samples:
        return None
    available = samples[-1][1]
    if available < floor:
        return Warning(Sign.MEMORY_LOW,
                       f"MemAvailable {available / GIB:.2f} GiB, under the floor {floor / GIB:.2f} GiB")
    rate = slope(samples)
    if rate < 0 and available + rate * HORIZON < floor:
        return Warning(Sign.MEMORY_FALLING, f"MemAvailable {available / GIB:.2f} GiB falling {-rate / MIB:.0f} MiB/s: "
                       f"under the floor {floor / GIB:.2f} GiB within {HORIZON:g} s")
    return None


def slope(samples: Sequence[tuple[float, int]]) -> float:
    """Bytes per second over the last SLOPE_OVER seconds of samples (0 with fewer than two)."""
    now = samples[-1][0] if samples else 0.0
    recent = [s for s in samples if now - s[0] <= SLOPE_OVER + 1e-9]
    if len(recent) < 2 or recent[-1][0] <= recent[0][0]:
        return 0.0
    return (recent[-1][1] - recent[0][1]) / (recent[-1][0] - recent[0][0])


def grew_last(started: Mapping[str, float]) -> str | None:
    """The engine that grew last, of the running ones (stack -> when it last started or woke,
    epoch seconds): unified memory shows no owner, so the newest engine is the likeliest to be
    still growing (a startup's profiling, a wake's re-mapping)."""
    return max(started, key=lambda s: (started[s], s), default=None)


@dataclass(frozen=True)
class Progress:
    """One engine's counters as the hang watch last saw them, and when they last moved."""

    generated: float
    prompt: float
    running: float
    moved: float  # when generated or prompt tokens last advanced (or requests started running)


GENERATED, PROMPT, RUNNING = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                              "vllm:num_requests_running")


def progress(before: Progress | None, counters: Mapping[str, float], now: float) -> Progress:
    """The engine's progress after a reading of its /metrics (`counters`: metric name -> value,
    labels summed, as `bench.metrics.parse` gives them). A long prefill advances prompt tokens,
    so it is progress; so is a counter that went back (a restarted engine)."""
    generated, prompt = counters.get(GENERATED, 0.0), counters.get(PROMPT, 0.0)
    running = counters.get(RUNNING, 0.0)
    if before is None or before.running <= 0 or (generated, prompt) != (before.generated, before.prompt):
        return Progress(generated, prompt, running, now)
    return Progress(generated, prompt, running, before.moved)


def hung(p: Progress, now: float, *, bound: float) -> bool:
    """Requests run and no token moved for `bound` seconds (or longer)."""
    return p.running > 0 and now - p.moved >= bound

