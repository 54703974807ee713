"""What every benchmark records about the machine it ran on."""

from __future__ import annotations

import platform
import statistics

import torch

from rankwise.env import usable_cores


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu, "cores": usable_cores(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def median(values: list[float]) -> float:
    return statistics.median(values)
