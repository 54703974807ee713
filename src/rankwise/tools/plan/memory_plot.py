"""plan.png: one panel per strategy, a stacked bar per world size of one rank's memory at the peak
by kind, against the device's memory and the usable limit."""

from __future__ import annotations

from pathlib import Path

from rankwise.tools.plan.planner import Plan
from rankwise.tools.plan.rank_memory import KINDS

COLOURS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer": "#55a868",
    "activations": "#c44e52",
    "buffers": "#8172b3",
}


def plot(plan: Plan, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strategies = list(dict.fromkeys(row.strategy for row in plan.rows))
    columns = min(3, len(strategies)) or 1
    lines = -(-len(strategies) // columns) or 1
    figure, axes = plt.subplots(
        lines, columns, figsize=(4.6 * columns, 3.8 * lines), squeeze=False, sharey=True
    )
    gib = 2**30
    for index, strategy in enumerate(strategies):
        axis = axes[index // columns][index % columns]
        rows = [row for row in plan.rows if row.strategy == strategy]
        labels = [str(row.world_size) for row in rows]
        bottom = [0.0] * len(rows)
        for kind in KINDS:
            values = [row.memory.at_peak[kind] / gib for row in rows]
            axis.bar(labels, values, bottom=bottom, color=COLOURS[kind], label=kind)
            bottom = [b + v for b, v in zip(bottom, values)]
        axis.axhline(
            plan.device.memory_bytes / gib,
            color="black",
            linewidth=1,
            label=f"{plan.device.name} memory",
        )
        axis.axhline(
            plan.limit / gib,
            color="black",
            linestyle="--",
            linewidth=1,
            label=f"usable ({plan.config.headroom:.0%} headroom)",
        )
        for x, row in enumerate(rows):
            if not row.fits:
                axis.annotate(
                    "does not fit",
                    (x, bottom[x]),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="#c44e52",
                )
        axis.set_title(strategy, fontsize=10)
        axis.set_xlabel("ranks")
        if index % columns == 0:
            axis.set_ylabel("GiB per rank at the peak")
    top = max([plan.device.memory_bytes] + [row.memory.peak for row in plan.rows]) / gib
    axes[0][0].set_ylim(0, top * 1.12)  # (shared: room above the tallest bar for its label)
    for index in range(len(strategies), lines * columns):
        axes[index // columns][index % columns].axis("off")
    handles, names = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8)
    figure.suptitle(f"rankwise plan: {plan.capture.source} ({plan.config.precision})", fontsize=10)
    figure.tight_layout(rect=(0, 0.06, 1, 0.96))
    figure.savefig(path, dpi=110)
    plt.close(figure)
