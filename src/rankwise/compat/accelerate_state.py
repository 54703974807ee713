"""Accelerate: process-wide singletons that outlive the process group they were built for."""

from __future__ import annotations

from rankwise.compat.versions import Workaround

RESET_STATE = Workaround(
    name="rankwise.compat.accelerate_state.reset_accelerate_state",
    library="accelerate",
    upstream="none filed: Accelerate's own tests reset the same way "
    "(AcceleratorState._reset_state); no public API to end an Accelerator",
    seen_on=("1.15",),
)


def reset_accelerate_state() -> None:
    """Forget Accelerate's process-wide ``AcceleratorState`` and ``GradientState`` after a run, so a
    later ``Accelerator`` in this process (a notebook, a second run, a pooled test rank) starts
    afresh instead of refusing other settings ("AcceleratorState has already been initialized") or
    reusing a destroyed group."""
    if not RESET_STATE.applies():
        return
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
