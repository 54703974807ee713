"""What every tool records about the machine it ran on: hardware, library versions."""

from __future__ import annotations

import platform
from importlib import metadata

import torch

from rankwise.process import usable_cores

LIBRARIES = (
    "torch",
    "rankwise",
    "transformers",
    "tokenizers",
    "deepspeed",
    "accelerate",
    "horovod",
)


def machine() -> dict:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = next(
                line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")
            )
    except (OSError, StopIteration):
        pass
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu,
        "cores": usable_cores(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found
