"""The agent-session part of a report: seconds per agent session for each stack and routed alias
a session was sent to, and a graph of each call's wait against its context, one line per stack
that answered, with a routed alias's thresholds marked. Reads `bench.agent` sessions as saved
(`agent-sessions.json`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

GRAPH = "agent_wait_vs_context.png"


def table(sessions: list[dict[str, Any]]) -> str:
    """Markdown: per session shape and target, the wall time and the wait per call."""
    lines = ["| session | sent to | calls | final context (tokens) | seconds per session | wait per call: median "
             "| worst | calls by stack |", "|---|---|---|---|---|---|---|---|"]
    for s in sessions:
        calls = s["calls"]
        by = {}
        for call in calls:
            by[call["stack"]] = by.get(call["stack"], 0) + 1
        lines.append(f"| {s['shape']} | {s['model']} | {len(calls)} | {calls[-1]['context'] if calls else 0} "
                     f"| {s['wall_s']:.1f} | {s['median_wait_s']:.2f} | {s['worst_wait_s']:.2f} "
                     f"| {', '.join(f'{k} {v}' for k, v in sorted(by.items()))} |")
    return "\n".join(lines) + "\n"


def draw(sessions: list[dict[str, Any]], folder: Path, *, thresholds: dict[str, list[int]] | None = None) -> str:
    """Each call's total wait against its context, one series per (target, stack that answered);
    a routed alias's `up_to` thresholds as dashed vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for s in sessions:
        for stack in dict.fromkeys(c["stack"] for c in s["calls"]):
            points = [(c["context"], c["total_s"]) for c in s["calls"] if c["stack"] == stack]
            label = s["model"] if stack == s["model"] else f"{s['model']} -> {stack}"
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
    for alias, limits in (thresholds or {}).items():
        for limit in limits:
            ax.axvline(limit, linestyle="--", color="grey", alpha=0.7)
            ax.text(limit, ax.get_ylim()[1] * 0.95, f" {alias} <= {limit}", fontsize=7, color="grey")
    ax.set(xlabel="context sent with the call (prompt tokens)", ylabel="wait for the answer (s)",
           title="agent session: time per call against context")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / GRAPH, dpi=110)
    plt.close(fig)
    return GRAPH
