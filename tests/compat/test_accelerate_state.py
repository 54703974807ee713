"""Accelerate keeps its state process-wide after the run that built it."""

import pytest

from rankwise.compat.accelerate_state import reset_accelerate_state

accelerate = pytest.importorskip(
    "accelerate", reason="Accelerate is not installed: pip install 'rankwise[accelerate]'"
)


def test_a_second_accelerator_in_the_process_meets_the_first_ones_state():
    """When this fails, Accelerate forgets its state by itself: drop reset_accelerate_state."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    reset_accelerate_state()
    try:
        Accelerator(cpu=True, mixed_precision="no")
        with pytest.raises(ValueError, match="already been initialized"):
            Accelerator(cpu=True, mixed_precision="bf16")
        reset_accelerate_state()
        assert not AcceleratorState._shared_state
        assert Accelerator(cpu=True, mixed_precision="bf16").mixed_precision == "bf16"
    finally:
        reset_accelerate_state()
