"""The simulator-accuracy plot: measured and simulated side by side, one panel per unit."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(cases: dict[str, Any], path: Path) -> None:
    """Bars per figure (latencies, rates and counts), errors written above each pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[str, list[tuple[str, dict[str, Any]]]] = {"ms": [], "per s / count": [],
                                                           "hit ratio": []}  # fmt: skip
    for case, figures in cases.items():
        for name, fig in figures.items():
            if not isinstance(fig, dict) or "error" not in fig:
                continue
            unit = "hit ratio" if "ratio" in name else "per s / count"
            unit = "ms" if name.endswith("_ms") else unit
            panels[unit].append((f"{case}\n{name}", fig))
    widths = [max(1, len(items)) for items in panels.values()]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": widths})
    for ax, (unit, items) in zip(axes, panels.items(), strict=True):
        xs = range(len(items))
        ax.bar([x - 0.2 for x in xs], [f["measured"] for _, f in items], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], [f["simulated"] for _, f in items], 0.4, label="simulated")
        for x, (_, f) in zip(xs, items, strict=True):
            top = max(f["measured"], f["simulated"])
            ax.text(x, top, f"{f['error']:.0%}" if unit != "hit ratio" else f"{f['error']:.3f}",
                    ha="center", va="bottom", fontsize=7)  # fmt: skip
        ax.set_xticks(list(xs), [label for label, _ in items], fontsize=6, rotation=30)
        ax.set_ylabel(unit)
    axes[0].legend()
    fig.suptitle("conveyor simulate against a real gateway + 3 workers on this machine "
                 "(labels: error)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
