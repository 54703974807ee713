"""Numeric precision: ``32-true``, ``bf16-mixed``, ``16-mixed``.

Mixed precision keeps fp32 weights and runs the forward pass under ``torch.autocast``;
fp16 also needs a ``GradScaler`` so small gradients do not underflow.  fp16 autocast on
the CPU is refused: it is slow and unsupported for many CPU kernels.
"""

from __future__ import annotations

import contextlib
from typing import Literal, get_args

import torch

PrecisionName = Literal["32-true", "bf16-mixed", "16-mixed"]
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)


class Precision:
    def __init__(self, name: str, device: torch.device):
        if name not in PRECISIONS:
            raise ValueError(f"unknown precision {name!r}; choose one of {', '.join(PRECISIONS)}")
        if name == "16-mixed" and device.type != "cuda":
            raise ValueError(
                "precision 16-mixed needs a CUDA device (fp16 autocast with a GradScaler); on the "
                "CPU use --precision bf16-mixed or 32-true"
            )
        self.name = name
        self.device = device
        self.dtype = {
            "32-true": torch.float32,
            "bf16-mixed": torch.bfloat16,
            "16-mixed": torch.float16,
        }[name]
        self.scaler = torch.amp.GradScaler(device.type) if name == "16-mixed" else None

    @property
    def mixed(self) -> bool:
        return self.name != "32-true"

    def autocast(self) -> contextlib.AbstractContextManager:
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Bring gradients back to their true scale (before clipping)."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler:
            self.scaler.step(optimizer)  # skips the step when gradients overflowed
            self.scaler.update()
        else:
            optimizer.step()

    def loss_scale(self) -> float:
        """What the gradients are multiplied by until the step unscales them (1 without a
        scaler)."""
        return float(self.scaler.get_scale()) if self.scaler else 1.0

    def state_dict(self) -> dict:
        return {"scaler": self.scaler.state_dict()} if self.scaler else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
