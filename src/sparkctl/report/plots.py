"""The report's graphs (PNG, matplotlib without a display), in seed 000's layout: decode tok/s,
TTFT and prefill tok/s against context depth (one line per config), and grouped bars of decode
per config at a few depths."""

from __future__ import annotations

from pathlib import Path


def draw(data: list[dict], folder: Path, *, subtitle: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    single = [r for r in data if r["concurrency"] == 1]
    configs = list(dict.fromkeys(r["config"] for r in single))
    written = []
    for key, label, name in (("decode_tps", "decode tok/s", "decode_vs_depth.png"),
                             ("ttft_ms", "TTFT (ms)", "ttft_vs_depth.png"),
                             ("prefill_tps", "prefill tok/s", "prefill_vs_depth.png")):
        fig, ax = plt.subplots(figsize=(9, 5))
        for config in configs:
            points = sorted((r["depth"], r[key]) for r in single if r["config"] == config)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=config)
        ax.set_xscale("symlog", linthresh=512)
        ax.set(xlabel="context depth (tokens)", ylabel=label, title=f"{label} vs context depth\n{subtitle}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(folder / name, dpi=110)
        plt.close(fig)
        written.append(name)
    written.append(_bars(plt, single, configs, folder, subtitle))
    return written


def _bars(plt, single: list[dict], configs: list[str], folder: Path, subtitle: str) -> str:
    depths = sorted({r["depth"] for r in single})
    shown = [d for d in (0, 8192, 32768) if d in depths] or depths[:3]
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(max(8, len(configs) * 1.1), 5))
    for i, depth in enumerate(shown):
        values = [next((r["decode_tps"] for r in single if r["config"] == c and r["depth"] == depth), 0)
                  for c in configs]
        ax.bar([x + i * width for x in range(len(configs))], values, width, label=f"depth {depth}")
    ax.set_xticks([x + width * (len(shown) - 1) / 2 for x in range(len(configs))], configs, rotation=30,
                  ha="right", fontsize=8)
    ax.set(ylabel="decode tok/s", title=f"decode per config\n{subtitle}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "decode_by_config.png", dpi=110)
    plt.close(fig)
    return "decode_by_config.png"
