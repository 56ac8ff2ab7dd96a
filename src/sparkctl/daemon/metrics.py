"""The daemon's own Prometheus metrics: reconcile passes, restarts, deploy outcomes, phase
durations and stack states."""

from __future__ import annotations

import threading
from collections import defaultdict


class DaemonMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: dict[tuple[str, str], int] = defaultdict(int)  # (stack, ok|failed) -> count
        self.phase_seconds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])  # phase -> [sum, count]

    def outcome(self, stack: str, ok: bool) -> None:
        with self._lock:
            self.outcomes[(stack, "ok" if ok else "failed")] += 1

    def phase(self, phase: str, seconds: float) -> None:
        with self._lock:
            entry = self.phase_seconds[phase]
            entry[0] += seconds
            entry[1] += 1

    def render(self, *, passes: int, restarts: int, states: dict[str, str]) -> str:
        lines = ["# TYPE sparkctl_reconcile_passes_total counter", f"sparkctl_reconcile_passes_total {passes}",
                 "# TYPE sparkctl_restarts_total counter", f"sparkctl_restarts_total {restarts}",
                 "# TYPE sparkctl_deploys_total counter"]
        with self._lock:
            lines += [f'sparkctl_deploys_total{{stack="{s}",outcome="{o}"}} {n}' for (s, o), n in
                      sorted(self.outcomes.items())]
            lines.append("# TYPE sparkctl_phase_seconds summary")
            for phase, (total, count) in sorted(self.phase_seconds.items()):
                lines += [f'sparkctl_phase_seconds_sum{{phase="{phase}"}} {total:.3f}',
                          f'sparkctl_phase_seconds_count{{phase="{phase}"}} {count}']
        lines.append("# TYPE sparkctl_stack_state gauge")
        lines += [f'sparkctl_stack_state{{stack="{s}",state="{st}"}} 1' for s, st in sorted(states.items())]
        return "\n".join(lines) + "\n"
