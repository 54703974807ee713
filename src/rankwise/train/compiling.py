"""What ``compile=true`` cost a run: the graphs Dynamo compiled and the seconds it took, each
recompile named by the guard that failed, and the dynamic-shape choice, in the summary beside the
warm-up's own time (which the steady throughput leaves out)."""

from __future__ import annotations

from collections import Counter

from rankwise.compat.dynamo_metrics import CompileRecord, snapshot

DYNAMIC_SHAPES = (
    "torch's default, automatic dynamic shapes: each graph is compiled for the shapes it first "
    "sees, and a dimension seen with a second size is compiled once more as dynamic; a text batch "
    "padded to a new length therefore recompiles once, then reuses the dynamic graph"
)
"""rankwise passes ``torch.compile`` no ``dynamic=`` (``compat.torch_compile.compile_forward``)."""

MOST_COMMON = 5
"""Recompile reasons the summary names (the rest are counted)."""


class CompileWatch:
    """Dynamo's records from the start of training (``enabled``: the run compiles)."""

    def __init__(self, enabled: bool):
        self.before: CompileRecord | None = snapshot() if enabled else None

    def summary(self) -> dict:
        """The summary's ``compile`` section ({} for an eager run)."""
        if self.before is None:
            return {}
        happened = snapshot() - self.before
        reasons = Counter(_without_frame(reason) for reason in happened.recompiles)
        return {
            "compile": {
                "graphs": happened.graphs,
                "compile_s": round(happened.seconds, 2),
                "recompiles": len(happened.recompiles),
                "recompile_reasons": dict(reasons.most_common(MOST_COMMON)),
                "dynamic_shapes": DYNAMIC_SHAPES,
            }
        }


def _without_frame(reason: str) -> str:
    """``"0/1: tensor 'x' size mismatch ..."`` without Dynamo's frame and compile ids, so the same
    guard failing in successive graphs counts as one reason."""
    head, _, rest = reason.partition(": ")
    return rest if rest and "/" in head and head.replace("/", "").isdigit() else reason


def line(summary: dict) -> str | None:
    """One line for the run's report: the warm-up's time, what compiling took, the recompiles."""
    compiled = summary.get("compile")
    if not compiled:
        return None
    reasons = "; ".join(
        f"{count} x {reason}" for reason, count in compiled["recompile_reasons"].items()
    )
    return (
        f"compile: warm-up {summary.get('warmup_s', 0):.1f} s over the first "
        f"{summary.get('warmup_steps', 0)} step(s), left out of the steady throughput; Dynamo "
        f"compiled {compiled['graphs']} graph(s) in {compiled['compile_s']:.1f} s, "
        f"{compiled['recompiles']} recompile(s)"
        + (f" ({reasons})" if reasons else "")
        + "; shapes: automatic dynamic (torch's default)"
    )
