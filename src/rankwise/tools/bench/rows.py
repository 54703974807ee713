"""The rows of ``rankwise bench``: every strategy as a user runs it, and loops that do not use
rankwise.

A row is either a rankwise run (``rankwise train --strategy NAME`` with a few settings) or a
baseline from :mod:`rankwise.tools.bench.baselines`.  Its equivalence tolerance is the one
:mod:`rankwise.measure.tolerance` states for its precision and gradient exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.measure.tolerance import tolerance
from rankwise.strategies import get_strategy, unavailable


@dataclass(frozen=True)
class Row:
    name: str
    strategy: str | None = None
    """A registered strategy or variant; None for a baseline."""
    settings: tuple[str, ...] = ()
    """``--set`` overrides of this row (precision, comm hook)."""
    baseline: str | None = None
    """A baseline loop style (``plain-ddp``, ...)."""
    about: str = ""
    threads: int | None = None
    """Threads per process when not the fair share of the cores (``single-1t``: one core's
    worth)."""
    opt_in: bool = False
    """Run only when named in ``--strategies`` (not part of the default set)."""
    full_only: bool = False
    """Left out of the quick preset's default set (``make demo`` shows one row per strategy and
    launcher; the variants and the extra baselines run in the full preset, or when named)."""
    smoke: bool = False
    """In the smoke preset's default set (``make demo DEMO_PRESET=smoke``, CI's run of the demo: the
    reference, rankwise's two main strategies and the hand-written loop, each with its check)."""

    @property
    def precision(self) -> str:
        return next(
            (s.split("=", 1)[1] for s in self.settings if s.startswith("precision=")), "32-true"
        )

    @property
    def comm_hook(self) -> str:
        return next(
            (s.split("=", 1)[1] for s in self.settings if s.startswith("ddp.comm_hook=")), "none"
        )

    @property
    def tolerance(self) -> float:
        return tolerance(self.precision, self.comm_hook)

    def processes(self, nproc: int) -> int:
        """Processes this row runs: one for one-process strategies (single, dp), else ``nproc``."""
        if self.baseline:
            return nproc
        assert self.strategy is not None  # a row is a baseline or a rankwise strategy
        return nproc if get_strategy(self.strategy).multiprocess else 1

    def missing(self) -> str | None:
        """Why this row cannot run here (a library not installed, with the install command), else
        None."""
        import importlib.util

        if self.baseline == "plain-accelerate" and importlib.util.find_spec("accelerate") is None:
            return "accelerate is not installed: pip install 'rankwise[accelerate]'"
        return unavailable(self.strategy) if self.strategy else None


ROWS = [
    Row("single", "single", about="one process, all cores", smoke=True),
    Row("dp", "dp", about="DataParallel: one process, one replica per device"),
    Row("ddp", "ddp", about="DistributedDataParallel under torchrun's agent", smoke=True),
    Row("ddp-spawn", "ddp-spawn", about="the same started by torch.multiprocessing spawn"),
    Row("ddp+bf16", "ddp", ("precision=bf16-mixed",), about="DDP with bf16 autocast"),
    Row(
        "ddp+fp16-hook",
        "ddp",
        ("ddp.comm_hook=fp16_compress",),
        about="DDP averaging gradients in fp16",
        full_only=True,
    ),
    Row(
        "ddp+bf16-hook",
        "ddp",
        ("ddp.comm_hook=bf16_compress",),
        about="DDP averaging gradients in bf16",
        opt_in=True,
    ),
    Row(
        "ddp+powersgd",
        "ddp",
        ("ddp.comm_hook=powersgd", "ddp.powersgd_start_step=2"),
        about="DDP sending a rank-1 PowerSGD approximation of the gradients",
        opt_in=True,
    ),
    Row(
        "single+compile",
        "single",
        ("compile=true",),
        about="one process with torch.compile",
        opt_in=True,
    ),
    Row(
        "single-1t",
        "single",
        threads=1,
        about="one process, one thread: the base of DDP's scaling efficiency",
        opt_in=True,
    ),
    Row(
        "ddp+compile",
        "ddp",
        ("compile=true",),
        about="DDP with torch.compile (inductor) after the wrap",
        full_only=True,
    ),
    Row("fsdp", "fsdp", about="FullyShardedDataParallel", smoke=True),
    Row(
        "fsdp+compile",
        "fsdp",
        ("compile=true",),
        about="FSDP with torch.compile after sharding",
        full_only=True,
    ),
    Row(
        "deepspeed-zero1",
        "deepspeed-zero1",
        about="DeepSpeed ZeRO-1: optimizer state sharded",
        full_only=True,
    ),
    Row("deepspeed-zero2", "deepspeed-zero2", about="ZeRO-2: also gradients"),
    Row("deepspeed-zero3", "deepspeed-zero3", about="ZeRO-3: also parameters", full_only=True),
    Row("accelerate", "accelerate", about="rankwise on Hugging Face Accelerate"),
    Row("horovod", "horovod", about="Horovod under horovodrun"),
    Row("plain-ddp", baseline="plain-ddp", about="hand-written DDP loop, no rankwise", smoke=True),
    Row(
        "plain-accelerate",
        baseline="plain-accelerate",
        about="Accelerate as its documentation shows it",
        full_only=True,
    ),
    Row(
        "per-step-sync",
        baseline="per-step-sync",
        about="barrier + loss all-reduce + .item() every step",
        full_only=True,
    ),
]


def select(names: list[str] | None, preset: str = "full") -> list[Row]:
    """The rows named (in the table's order), or the preset's default set; an unknown name is an
    error listing the known ones."""
    if not names and preset == "smoke":
        return [row for row in ROWS if row.smoke]
    if not names:
        return [row for row in ROWS if not row.opt_in and not (row.full_only and preset == "quick")]
    known = {row.name: row for row in ROWS}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown bench row(s) {', '.join(unknown)}; choose from {', '.join(known)}"
        )
    chosen = [row for row in ROWS if row.name in names]
    if chosen[0].name != "single":
        chosen.insert(0, known["single"])  # the reference of speedup and equivalence
    return chosen
