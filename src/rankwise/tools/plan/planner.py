"""The plan: for every strategy and world size, one rank's memory, whether it fits, what it
communicates, its step time; the fastest that fits, and for one that does not, the cheapest change
that makes it fit.

Traces are replayed once per distinct (micro-batch rows, parameter dtype, autocast, checkpointing)
and shared by every strategy that needs them; FSDP is measured on fake ranks at each world size
(:mod:`~rankwise.tools.plan.fsdp_fake_ranks`), every other strategy is a formula over a trace
(:mod:`~rankwise.tools.plan.rank_memory`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from rankwise.logs import get_logger
from rankwise.strategies import lookup
from rankwise.strategies.options import DDPOptions, DeepSpeedOptions
from rankwise.tools.plan.calibrate import MAX_SHARE, timed_step
from rankwise.tools.plan.capture import Capture
from rankwise.tools.plan.comms import Bandwidth, Collective, collectives
from rankwise.tools.plan.config import PlanConfig
from rankwise.tools.plan.devices import Device
from rankwise.tools.plan.fake_step import Trace, trace
from rankwise.tools.plan.fsdp_fake_ranks import at_world, fsdp
from rankwise.tools.plan.rank_memory import Memory, Setting, formula
from rankwise.tools.plan.timing import StepTime, Timed, step_time

log = get_logger(__name__)

HALF = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
SAME_TIME = 0.01
"""Planned steps closer than this share are the same time: the fastest of them is the one needing
least memory (a tiny model's steps differ by nanoseconds of sharded optimizer work, and ZeRO-3's 19
MiB buffers then lost to nothing against DDP's 3 KiB)."""


@dataclass
class Row:
    """One strategy at one world size."""

    strategy: str
    """The strategy's registered name."""
    world_size: int
    """Ranks in the job."""
    rows: int
    """Samples per rank per micro-batch."""
    memory: Memory
    """One rank's memory."""
    fits: bool
    """Whether the peak stays under the device's memory less the headroom."""
    collectives: list[Collective]
    """What the strategy communicates per optimizer step."""
    time: StepTime
    """One optimizer step's time per rank."""
    precision: str
    """The precision planned (``32-true``, ``bf16-mixed``, ``16-mixed``)."""
    checkpointing: bool
    """Whether the layers recompute their activations in the backward pass."""
    change: str = ""
    """For a row that does not fit: the cheapest change that makes it fit (empty when it fits, or
    none does)."""


@dataclass
class Plan:
    config: PlanConfig
    """What was asked."""
    capture: Capture
    """The script's captured step."""
    device: Device
    """The device planned for."""
    bandwidth: Bandwidth
    """The links (the widest job's, or ``--comm``'s measurement)."""
    nodes: dict[int, int]
    """Nodes each world size spans."""
    rows: list[Row] = field(default_factory=list)
    """Every strategy at every world size (the rows tried as cheaper changes are not listed)."""
    notes: list[str] = field(default_factory=list)
    """Lines the reading adds (what was assumed, how long planning took)."""
    elapsed_s: float = 0.0
    """Seconds the planning took (capture included)."""
    peak_rss_mb: float = 0.0
    """The planning process's peak resident memory, MB."""

    @property
    def limit(self) -> int:
        """Bytes a rank may use: the device's memory less the headroom."""
        return int(self.device.memory_bytes * (1 - self.config.headroom))

    def fastest(self, world: int) -> Row | None:
        """The fitting row with the shortest step; of steps tied with it (:meth:`ties`), the one
        that needs the least memory."""
        tied = self.ties(world)
        return min(tied, key=lambda row: (row.memory.peak, row.time.total_s)) if tied else None

    def ties(self, world: int) -> list[Row]:
        """The fitting rows whose steps cannot be told from the shortest: within :data:`SAME_TIME`
        of it, or within either step's timing noise (a CPU step timed here)."""
        fitting = [row for row in self.rows if row.world_size == world and row.fits]
        if not fitting:
            return []
        best = min(fitting, key=lambda row: row.time.total_s)
        shortest = best.time.total_s
        return [
            row
            for row in fitting
            if row.time.total_s <= shortest * (1 + max(SAME_TIME, best.time.noise, row.time.noise))
        ]


class Planner:
    def __init__(
        self,
        config: PlanConfig,
        capture: Capture,
        device: Device,
        bandwidth: Bandwidth,
        nodes: dict[int, int],
    ):
        self.config, self.capture, self.device, self.bandwidth = config, capture, device, bandwidth
        self.plan = Plan(config, capture, device, bandwidth, nodes)
        self.traces: dict[tuple, Trace] = {}
        self.timed: dict[tuple, Timed | None] = {}
        self.fsdp_cache: dict[tuple, Memory] = {}
        self.fsdp_measured: dict[tuple, tuple[int, Memory]] = {}
        """FSDP measured on fake ranks, by (rows, autocast, checkpointing): (world size, memory)."""
        self.ddp, self.zero = DDPOptions(), DeepSpeedOptions()

    # -- the pieces --------------------------------------------------------------------------------
    def rows_per_rank(self, world: int) -> int:
        if self.config.micro_batch:
            return self.config.micro_batch
        if self.capture.global_batch:
            return max(1, math.ceil(self.capture.global_batch / world))
        return self.capture.rows

    def dtypes(
        self, strategy: str, precision: str
    ) -> tuple[torch.dtype | None, torch.dtype | None]:
        """(parameter dtype, autocast dtype) of the strategy's step at ``precision``."""
        half = HALF.get(precision)
        if half is None:
            return None, None
        facts = lookup(strategy).facts
        # an engine that casts the model to 16 bits runs no autocast (its file says which)
        return (half, None) if facts is not None and facts.casts_model else (None, half)

    def trace_for(
        self,
        rows: int,
        param_dtype: torch.dtype | None,
        autocast: torch.dtype | None,
        checkpointing: bool,
    ) -> Trace:
        key = (rows, param_dtype, autocast, checkpointing)
        if key not in self.traces:
            log.info(
                f"rankwise plan: replaying the step on fake tensors: {rows} rows a rank"
                + (f", parameters {param_dtype}" if param_dtype else "")
                + (f", autocast {autocast}" if autocast else "")
                + (", checkpointed" if checkpointing else "")
            )
            self.traces[key] = trace(
                self.capture,
                rows,
                param_dtype=param_dtype,
                autocast=autocast,
                checkpointing=checkpointing,
            )
        return self.traces[key]

    def timed_for(self, strategy: str, trace: Trace, world: int, precision: str) -> Timed | None:
        """The real step timed here at one rank, for a plan of this machine's CPU whose model fits
        (else None)."""
        if self.device.name != "cpu" or self.config.no_timing:
            return None
        peak = trace.param_bytes + trace.optimizer_bytes + trace.gradient_bytes + trace.peak()[0]
        if peak > MAX_SHARE * self.device.memory_bytes:
            return None
        from rankwise.process import threads_per_process

        # (OMP_NUM_THREADS where set)
        threads = threads_per_process(max(1, world // self.config.nnodes))
        key = (strategy, trace.rows, precision, trace.checkpointed, threads)
        if key not in self.timed:
            log.info(
                f"rankwise plan: timing {strategy}'s real step here at one rank ({trace.rows} "
                f"rows, {threads} thread(s))"
            )
            self.timed[key] = timed_step(
                self.capture, strategy, precision, trace.rows, threads, trace.checkpointed
            )
        return self.timed[key]

    def memory(
        self, strategy: str, world: int, rows: int, precision: str, checkpointing: bool
    ) -> tuple[Memory, Trace]:
        param_dtype, autocast = self.dtypes(strategy, precision)
        trace = self.trace_for(rows, param_dtype, autocast, checkpointing)
        model = formula(strategy)
        if model is None:  # FSDP2's units, which fake tensors reach: measured on fake ranks
            key = (world, rows, autocast, checkpointing)
            measured = self.fsdp_measured.get(key[1:])
            if key in self.fsdp_cache:
                pass
            elif measured is not None and world > 1:  # one measurement a shape, scaled to world
                shapes = [p.shape for p in self.capture.model.parameters()]
                self.fsdp_cache[key] = at_world(measured[1], measured[0], world, shapes)
            else:
                log.info(f"rankwise plan: fsdp on {world} fake ranks ({rows} rows a rank)")
                self.fsdp_cache[key] = fsdp(
                    self.capture,
                    rows,
                    world,
                    autocast=autocast,
                    checkpointing=checkpointing,
                    grad_accum=self.capture.grad_accum,
                    gloo=self.device.name == "cpu",
                )
                if world > 1:  # (one rank shards nothing, and has no gloo copies)
                    self.fsdp_measured[key[1:]] = (world, self.fsdp_cache[key])
            return self.fsdp_cache[key], trace
        setting = Setting(
            world_size=world,
            grad_accum=self.capture.grad_accum,
            ddp_bucket_view=self.ddp.gradient_as_bucket_view,
            zero_bucket=self.zero.bucket_size,
            zero_max_live=self.zero.max_live_parameters,
            gloo=self.device.name == "cpu",
        )
        return model(trace, setting), trace

    def row(self, strategy: str, world: int, precision: str, checkpointing: bool) -> Row:
        rows = self.rows_per_rank(world)
        memory, trace = self.memory(strategy, world, rows, precision, checkpointing)
        calls = collectives(
            strategy,
            trace,
            world,
            self.capture.grad_accum,
            half=precision in HALF,
            clips=self.capture.clips_at is not None,
            bucket=self.zero.bucket_size,
            max_live=self.zero.max_live_parameters,
        )
        timed = self.timed_for(strategy, trace, world, precision)
        time = step_time(
            strategy,
            trace,
            world,
            self.capture.grad_accum,
            self.device,
            precision in HALF,
            calls,
            self.bandwidth_for(world),
            timed,
        )
        return Row(
            strategy,
            world,
            rows,
            memory,
            memory.peak <= self.plan.limit,
            calls,
            time,
            precision,
            checkpointing or trace.checkpointed,
        )

    def bandwidth_for(self, world: int) -> Bandwidth:
        from rankwise.tools.plan.comms import from_device

        if self.config.comm is not None:
            return self.bandwidth
        return from_device(self.device, self.plan.nodes[world])

    # -- the plan ----------------------------------------------------------------------------------
    def run(self) -> Plan:
        config = self.config
        for world in config.world_sizes:
            for strategy in config.strategies_at(world):
                row = self.row(strategy, world, config.precision, config.activation_checkpointing)
                self.plan.rows.append(row)
        for row in self.plan.rows:
            if not row.fits:
                row.change = self.cheapest_change(row)
        return self.plan

    def cheapest_change(self, row: Row) -> str:
        """The change that makes ``row`` fit with the shortest step, among: a ZeRO stage or FSDP at
        its world size, activation checkpointing, bf16, and (for a strategy that shards) more ranks
        of the planned sizes."""
        options: list[tuple[float, str]] = []
        for strategy in self.config.sharding_upgrades(row.strategy):
            other = self.row(strategy, row.world_size, row.precision, row.checkpointing)
            if other.fits:
                options.append((other.time.total_s, f"{strategy} at {row.world_size} ranks"))
        # (checkpointing drops activations only: where what a rank holds throughout, its parameters
        # and optimizer state, is already over the limit, no replay with it can fit; 18 CPU-s of
        # the 8B plan were that replay, for DDP's rows alone)
        states = row.memory.parameters + row.memory.optimizer
        if not row.checkpointing and states <= self.plan.limit:
            other = self.row(row.strategy, row.world_size, row.precision, True)
            if other.fits:
                options.append((other.time.total_s, "activation checkpointing"))
        if row.precision == "32-true":
            other = self.row(row.strategy, row.world_size, "bf16-mixed", row.checkpointing)
            if other.fits:
                options.append((other.time.total_s, "--precision bf16-mixed"))
        larger = [
            r
            for r in self.plan.rows
            if r.strategy == row.strategy
            and r.world_size > row.world_size
            and r.fits
            and r.precision == row.precision
            and r.checkpointing == row.checkpointing
        ]
        if larger:
            best = min(larger, key=lambda r: r.world_size)
            options.append((best.time.total_s, f"{best.world_size} ranks"))
        if not options:
            return (
                "nothing planned fits: more ranks with a sharding strategy, or a smaller "
                "micro-batch"
            )
        options.sort()
        seconds, change = options[0]
        return f"{change} (step {seconds * 1e3:,.0f} ms)"
