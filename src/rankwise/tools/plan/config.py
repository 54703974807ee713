"""``rankwise plan``'s settings, checked before anything runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rankwise.errors import ConfigError
from rankwise.precision import PRECISIONS
from rankwise.strategies import lookup, with_facts
from rankwise.strategies.facts import Facts


def known() -> list[str]:
    """Every strategy the plan has a model of: those whose facts give a memory layout
    (:mod:`rankwise.strategies.facts`), the least sharded first."""
    return [v.name for v in with_facts() if v.facts is not None and v.facts.layout is not None]


def planned() -> list[str]:
    """The strategies planned by default (``single`` at one rank only; DeepSpeed's where it is
    installed): those the facts do not keep for when named (Accelerate, DDP underneath; Horovod,
    whose buffer is outside torch)."""
    return [name for name in known() if _facts(name).planned]


def upgrades(strategy: str) -> list[str]:
    """The known strategies that shard strictly more than ``strategy`` (a candidate change for a
    row that does not fit)."""
    mine = _facts(strategy)
    return [name for name in known() if _facts(name).shards_more_than(mine)]


def _facts(name: str) -> Facts:
    facts = lookup(name).facts
    assert facts is not None, name  # known() lists only strategies with facts
    return facts


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
    """Strategies to plan; empty: every one of :func:`planned` that is installed (``single`` at
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

    def __post_init__(self) -> None:
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
        unknown = [name for name in self.strategies if name not in known()]
        if unknown:
            raise ConfigError(
                f"--strategies: rankwise plan has no model of {', '.join(unknown)}; choose from "
                f"{', '.join(known())}"
            )
        if not self.strategies:
            self.strategies = [name for name in planned() if _installed(name)]
        else:
            missing = [name for name in self.strategies if not _installed(name)]
            if missing:
                from rankwise.strategies import unavailable

                raise ConfigError(unavailable(missing[0]))

    @property
    def world_sizes(self) -> list[int]:
        return sorted({n * self.nnodes for n in self.nproc_per_node})

    def strategies_at(self, world: int) -> list[str]:
        """The planned strategies that run at ``world`` ranks (one-process ones only at one)."""
        return [name for name in self.strategies if lookup(name).cls.multiprocess or world == 1]

    def sharding_upgrades(self, strategy: str) -> list[str]:
        return [name for name in upgrades(strategy) if _installed(name)]


def _installed(name: str) -> bool:
    from rankwise.strategies import unavailable

    return unavailable(name) is None
