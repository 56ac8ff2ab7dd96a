"""The dashboard's charts as SVG, drawn by the daemon from `messages.Series` (GET /v1/chart): each
stack's tokens/s, its median time to first token, its requests in flight and queued, and unified
memory (awake, parked, free, under the ceiling), over the last 15 minutes with the alias switches
marked on the time axis. Drawn here rather than in the page: no charting library to ship and keep
current, the page's strict Content-Security-Policy untouched (a same-origin image runs no
script), and every chart testable without a browser. Pure."""

from __future__ import annotations

from html import escape

from sparkctl.messages import Series

CHARTS = {"tps": "tokens/s", "ttft": "TTFT p50 (ms)", "requests": "requests", "memory": "share of unified memory"}
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 640, 220, 52, 12, 28, 26
SPAN = 15 * 60.0  # s shown: the recorder's window
COLORS = ("#2a7ab8", "#d9822b", "#3a9a5b", "#b8432a", "#7a5ab8", "#8a8a2a")
Line = tuple[str, tuple[float | None, ...], str, bool]  # label, values, colour, dashed


def chart(series: Series, name: str, *, now: float) -> str:
    """Chart `name` (one of CHARTS) of `series`, its time axis ending at `now`."""
    lines = _lines(series, name)
    known = [v for _, values, _, _ in lines for v in values if v is not None]
    top = _nice(max([*known, series.ceiling if name == "memory" else 0.0, 1e-9]))
    if name == "memory":
        top = 1.0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-label="{escape(CHARTS[name])}, last 15 minutes" font-family="sans-serif" font-size="11">',
             f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',  # readable on the page's dark theme too
             f'<text x="{LEFT}" y="14" font-weight="bold">{escape(CHARTS[name])}</text>']
    parts += _axes(top, name)
    for at, what in series.switches:
        x = _x(at, now)
        parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" stroke="#999" '
                     f'stroke-dasharray="3 3"><title>{escape(what)}</title></line>'
                     f'<text x="{x + 2:.1f}" y="{TOP + 10}" fill="#666">switch</text>')
    for i, (label, values, colour, dashed) in enumerate(lines):
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        for run in _runs(series.at, values):
            points = " ".join(f"{_x(at, now):.1f},{_y(v, top):.1f}" for at, v in run)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5"{dash} points="{points}"/>')
        parts.append(f'<text x="{WIDTH - RIGHT}" y="{14 + 12 * i}" text-anchor="end" fill="{colour}">'
                     f'{escape(label)}</text>')
    if not series.at:
        parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" fill="#666">no samples yet: '
                     'the daemon samples every 5 s</text>')
    return "".join(parts) + "</svg>"


def _lines(series: Series, name: str) -> list[Line]:
    if name == "memory":
        flat = tuple(series.ceiling for _ in series.at)
        return [("awake", series.awake, COLORS[0], False), ("parked", series.parked, COLORS[1], False),
                ("free", series.free, COLORS[2], False), ("ceiling", flat, "#b8432a", True)]
    lines: list[Line] = []
    for i, (stack, figures) in enumerate(sorted(series.stacks.items())):
        colour = COLORS[i % len(COLORS)]
        if name == "tps":
            lines.append((stack, figures.tps, colour, False))
        elif name == "ttft":
            lines.append((stack, figures.ttft_p50_ms, colour, False))
        else:
            lines.append((f"{stack} in flight", tuple(map(float, figures.in_flight)), colour, False))
            lines.append((f"{stack} queued", tuple(map(float, figures.queued)), colour, True))
    return lines


def _axes(top: float, name: str) -> list[str]:
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    parts = [f'<line x1="{LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#444"/>',
             f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}" stroke="#444"/>']
    for value in (0.0, top / 2, top):
        label = f"{value:.0%}" if name == "memory" else f"{value:g}"
        parts.append(f'<text x="{LEFT - 4}" y="{_y(value, top) + 4:.1f}" text-anchor="end">{label}</text>')
    for minutes in (15, 10, 5, 0):
        x = LEFT + (right - LEFT) * (1 - minutes * 60 / SPAN)
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="middle">'
                     f'{"now" if minutes == 0 else f"−{minutes} min"}</text>')
    return parts


def _runs(at: tuple[float, ...], values: tuple[float | None, ...]) -> list[list[tuple[float, float]]]:
    """The stretches of known values (a gap, such as an engine not answering, breaks the line)."""
    runs: list[list[tuple[float, float]]] = [[]]
    for when, value in zip(at, values, strict=False):
        if value is None:
            runs.append([])
        else:
            runs[-1].append((when, value))
    return [run for run in runs if run]


def _x(at: float, now: float) -> float:
    return LEFT + (WIDTH - RIGHT - LEFT) * max(0.0, 1 - (now - at) / SPAN)


def _y(value: float, top: float) -> float:
    return HEIGHT - BOTTOM - (HEIGHT - BOTTOM - TOP) * min(value / top, 1.0)


def _nice(value: float) -> float:
    """The next 1, 2 or 5 × 10^n at or above `value`: the y axis' top."""
    scale = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    for step in (1, 2, 5, 10):
        if value <= step * scale:
            return step * scale
    return 10 * scale
