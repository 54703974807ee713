"""``verify.png``: how each step's differences evolve, against their tolerances, so rounding (flat,
far below the line) and a defect (a jump over it) look different at a glance."""

from __future__ import annotations

from pathlib import Path

from rankwise.measure.tolerance import UPDATE
from rankwise.tools.verify.records import VerifyReport

FLOOR = 1e-12
"""Where a difference of exactly zero is drawn on the logarithmic axis."""

CEILING = 1e6
"""Where an infinite one is (a tensor only the N ranks moved)."""


def plot(report: VerifyReport, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [line for line in report["step_lines"] if line["step"]]
    steps = [line["step"] for line in lines]
    figure, (gradients, weights) = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    panels = (
        (
            gradients,
            "gradient_diff",
            report["gradient_tolerance"],
            "gradient vs one process (relative)",
        ),
        (
            weights,
            "update_diff",
            report.get("update_tolerance") or UPDATE,
            "each tensor's update vs one process's (relative)",
        ),
    )
    columns: dict[str, list[float | None]] = {
        "gradient_diff": [line["gradient_diff"] for line in lines],
        "update_diff": [line.get("update_diff") for line in lines],
    }
    for axis, key, limit, title in panels:
        assert limit is not None  # steps were compared: the comparison had its tolerances
        values = columns[key]
        axis.semilogy(
            steps,
            [min(max(v, FLOOR), CEILING) if v is not None else float("nan") for v in values],
            marker=".",
            color="tab:blue",
        )
        bad = [
            (s, min(max(v, FLOOR), CEILING))
            for s, v, line in zip(steps, values, lines, strict=True)
            if v is not None and v > limit
        ]
        if bad:
            axis.semilogy(*zip(*bad, strict=True), "o", color="tab:red", label="over the tolerance")
        axis.axhline(
            limit, color="tab:red", linestyle="--", linewidth=1, label=f"tolerance {limit:.0e}"
        )
        axis.legend(loc="center right", fontsize=8)
        axis.set_title(title, fontsize=10)
        axis.set_xlabel("optimizer step" + (" (exact zeros drawn at 1e-12)" if 0 in values else ""))
    figure.suptitle(
        f"rankwise verify: {report['strategy']} on {report['processes']} ranks, one process in "
        f"lockstep ({report['verdict']})",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
