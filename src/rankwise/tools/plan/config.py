"""``rankwise plan``'s settings, checked before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rankwise.errors import ConfigError
from rankwise.precision import PRECISIONS

PLANNED = ("single", "ddp", "fsdp", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3")
"""The strategies planned by default (``single`` at one rank only; DeepSpeed's where it is
installed)."""
KNOWN = (*PLANNED, "accelerate", "horovod")
"""Every strategy the plan has a model of: Accelerate is DDP underneath; Horovod's fusion buffer is
outside torch."""
UPGRADES = {
    "single": ("ddp", "fsdp", "deepspeed-zero3"),
    "ddp": ("deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "fsdp"),
    "accelerate": ("deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "fsdp"),
    "horovod": ("deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3", "fsdp"),
    "deepspeed-zero1": ("deepspeed-zero2", "deepspeed-zero3"),
    "deepspeed-zero2": ("deepspeed-zero3",),
    "deepspeed-zero3": (),
    "fsdp": (),
}
"""The strategies that shard more than each one does (a candidate change for a row that does not
fit)."""


def parse_sizes(text: str) -> list[int]:
    """``8,64,512`` -> ``[8, 64, 512]``."""
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            f"--nproc-per-node {text!r}: a comma-separated list of positive integers"
        ) from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"--nproc-per-node {text!r}: a comma-separated list of positive integers")
    return sorted(set(sizes))


@dataclass
class PlanConfig:
    script: Path
    """The training script whose first step is captured."""
    script_args: list[str] = field(default_factory=list)
    """The script's own arguments (after ``--``)."""
    nproc_per_node: list[int] = field(default_factory=lambda: [1, 2])
    """Ranks per node to plan, one world size each."""
    nnodes: int = 1
    """Nodes; the world size is nnodes x nproc-per-node."""
    strategies: list[str] = field(default_factory=list)
    """Strategies to plan; empty: every one of :data:`PLANNED` that is installed (``single`` at
    world size 1)."""
    precision: str = "32-true"
    """``32-true``, ``bf16-mixed`` or ``16-mixed``, as ``rankwise launch --precision``."""
    activation_checkpointing: bool = False
    """Plan with each transformer layer's activations recomputed in the backward pass."""
    device: str | None = None
    """The device to plan for (``h100``, ``a100``, ..., ``cpu``); ``None``: the one present."""
    headroom: float = 0.1
    """The share of the device's memory left free (the framework's own context, allocator
    fragmentation)."""
    efficiency: float | None = None
    """The share of the device's peak FLOP/s the step's FLOPs run at; ``None``: the device's stated
    default."""
    comm: Path | None = None
    """A ``comm.json`` from ``rankwise comm bench`` whose measured bandwidths replace the device's
    link."""
    micro_batch: int | None = None
    """Samples per rank per micro-batch at every world size; ``None``: the script's global batch
    split over the ranks (its own micro-batch for a script not on ``rt.loader``)."""
    no_timing: bool = False
    """Do not time the model's real passes on this CPU (use FLOPs at the stated efficiency
    instead)."""
    out: Path = Path("runs/plan")
    """Where plan.md, plan.json and plan.png are written."""

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"--precision {self.precision!r}: choose one of {', '.join(PRECISIONS)}"
            )
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes {self.nnodes}: at least 1")
        if not 0 <= self.headroom < 1:
            raise ConfigError(
                f"--headroom {self.headroom}: a share of the memory, at least 0 and below 1"
            )
        if self.efficiency is not None and not 0 < self.efficiency <= 1:
            raise ConfigError(
                f"--efficiency {self.efficiency}: a share of the peak, above 0 and at most 1"
            )
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ConfigError(f"--micro-batch {self.micro_batch}: at least 1")
        if not Path(self.script).is_file():
            raise ConfigError(f"{self.script}: no such script")
        if self.comm is not None and not Path(self.comm).is_file():
            raise ConfigError(
                f"--comm {self.comm}: no such file (run rankwise comm bench --out DIR first)"
            )
        unknown = [name for name in self.strategies if name not in KNOWN]
        if unknown:
            raise ConfigError(
                f"--strategies: rankwise plan has no model of {', '.join(unknown)}; choose from "
                f"{', '.join(KNOWN)}"
            )
        if not self.strategies:
            self.strategies = [name for name in PLANNED if _installed(name)]
        else:
            missing = [name for name in self.strategies if not _installed(name)]
            if missing:
                from rankwise.strategies import unavailable

                raise ConfigError(unavailable(missing[0]))

    @property
    def world_sizes(self) -> list[int]:
        return sorted({n * self.nnodes for n in self.nproc_per_node})

    def strategies_at(self, world: int) -> list[str]:
        """The planned strategies that run at ``world`` ranks (``single`` only at one)."""
        return [name for name in self.strategies if name != "single" or world == 1]

    def sharding_upgrades(self, strategy: str) -> list[str]:
        return [name for name in UPGRADES.get(strategy, ()) if _installed(name)]


def _installed(name: str) -> bool:
    from rankwise.strategies import unavailable

    return unavailable(name) is None
