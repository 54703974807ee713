"""rankwise comm bench: the collectives timed over message sizes, checked, and set against this
machine's limits.

For every operation and size (powers of two from --min-bytes to --max-bytes): the median
and p90 time of --iters calls after --warmup (each call's time is the slowest rank's),
algbw = bytes / time and busbw = algbw x the nccl-tests factor (all_reduce 2(n-1)/n;
all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1), and #wrong: the
elements that differ from the independently computed result after one more call on known
data.  "size" is the larger buffer, as in nccl-tests: all_gather's output, reduce_scatter's
input, all_to_all's per-rank buffer.

Measured in the same run: loopback TCP between two processes (one direction alone and
each direction while both are busy), one thread copying memory, across nodes TCP between
node 0 and node 1 (on --master-port + 1), and the harness's own overhead on a 4-byte
all_reduce against a bare loop of dist.all_reduce.

Writes comm.json (every number), comm.md and comm.png (busbw against size, ceilings as
lines) to --out, and prints the table.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as torch_dist

from rankwise.errors import ConfigError
from rankwise.logs import get_logger
from rankwise.tools.comm.ops import all_gather_tensor, reduce_scatter_tensor
from rankwise.tools.comm.records import CommResult, CommRow, Harness, Sweep
from rankwise.tools.comm.sizes import elements, sizes_between

if TYPE_CHECKING:
    from rankwise.process import ProcessEnv
    from rankwise.tools.harness import NodeLayout

log = get_logger(__name__)

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
}
OVERHEAD_ITERS = 200
OVERHEAD_ROUNDS = 15
PATTERN = 7
"""Check data: element i of rank r is (i mod 7) + r + 1, small integers every dtype holds
exactly."""


@dataclass(frozen=True)
class BenchOp:
    name: str
    factor: Callable[[int], float]
    """busbw / algbw for n ranks (nccl-tests' convention)."""
    make: Callable[[int, int, int, torch.dtype, torch.device], Case]
    """(elements, rank, world size, dtype, device) -> the buffers and the call."""


@dataclass
class Case:
    run: Callable[[], object]
    output: torch.Tensor
    inputs: list[torch.Tensor]
    expected: Callable[[], torch.Tensor | None]
    """The output the check call must produce (``None``: unspecified on this rank)."""
    fill: Callable[[], None]


def pattern(
    count: int, rank: int, dtype: torch.dtype, device: torch.device, start: int = 0
) -> torch.Tensor:
    index = torch.arange(start, start + count, device=device, dtype=torch.int64)
    return (index % PATTERN + rank + 1).to(dtype)


def summed(
    count: int, n: int, dtype: torch.dtype, device: torch.device, start: int = 0
) -> torch.Tensor:
    """The sum over ranks of ``pattern``: n·(i mod 7) + n(n+1)/2, computed without communicating."""
    index = torch.arange(start, start + count, device=device, dtype=torch.int64)
    return (index % PATTERN * n + n * (n + 1) // 2).to(dtype)


def _case(
    run: Callable[[], object],
    output: torch.Tensor,
    inputs: list[torch.Tensor],
    expected: Callable[[], torch.Tensor | None],
    fill_with: Callable[[], list[torch.Tensor]],
) -> Case:
    def fill() -> None:
        for tensor, values in zip(inputs, fill_with()):
            tensor.copy_(values)

    return Case(run, output, inputs, expected, fill)


def _all_reduce(count: int, rank: int, n: int, dtype: torch.dtype, device: torch.device) -> Case:
    buf = torch.zeros(count, dtype=dtype, device=device)
    return _case(
        lambda: torch_dist.all_reduce(buf),
        buf,
        [buf],
        lambda: summed(count, n, dtype, device),
        lambda: [pattern(count, rank, dtype, device)],
    )


def _reduce(count: int, rank: int, n: int, dtype: torch.dtype, device: torch.device) -> Case:
    buf = torch.zeros(count, dtype=dtype, device=device)
    return _case(
        lambda: torch_dist.reduce(buf, dst=0),
        buf,
        [buf],
        lambda: summed(count, n, dtype, device) if rank == 0 else None,
        lambda: [pattern(count, rank, dtype, device)],
    )


def _broadcast(count: int, rank: int, n: int, dtype: torch.dtype, device: torch.device) -> Case:
    buf = torch.zeros(count, dtype=dtype, device=device)
    return _case(
        lambda: torch_dist.broadcast(buf, src=0),
        buf,
        [buf],
        lambda: pattern(count, 0, dtype, device),
        lambda: [pattern(count, rank, dtype, device)],
    )


def _all_gather(count: int, rank: int, n: int, dtype: torch.dtype, device: torch.device) -> Case:
    per_rank = count // n
    mine = torch.zeros(per_rank, dtype=dtype, device=device)
    out = torch.zeros(per_rank * n, dtype=dtype, device=device)
    return _case(
        lambda: all_gather_tensor(out, mine),
        out,
        [mine],
        lambda: torch.cat([pattern(per_rank, r, dtype, device) for r in range(n)]),
        lambda: [pattern(per_rank, rank, dtype, device)],
    )


def _reduce_scatter(
    count: int, rank: int, n: int, dtype: torch.dtype, device: torch.device
) -> Case:
    per_rank = count // n
    whole = torch.zeros(per_rank * n, dtype=dtype, device=device)
    out = torch.zeros(per_rank, dtype=dtype, device=device)
    return _case(
        lambda: reduce_scatter_tensor(out, whole),
        out,
        [whole],
        lambda: summed(per_rank, n, dtype, device, start=rank * per_rank),
        lambda: [pattern(per_rank * n, rank, dtype, device)],
    )


def _all_to_all(count: int, rank: int, n: int, dtype: torch.dtype, device: torch.device) -> Case:
    per_rank = count // n
    source = torch.zeros(per_rank * n, dtype=dtype, device=device)
    out = torch.zeros(per_rank * n, dtype=dtype, device=device)
    # Rank r's chunk j goes to rank j, so this rank receives every rank's chunk `rank`.
    return _case(
        lambda: torch_dist.all_to_all_single(out, source),
        out,
        [source],
        lambda: torch.cat(
            [pattern(per_rank, r, dtype, device, start=rank * per_rank) for r in range(n)]
        ),
        lambda: [pattern(per_rank * n, rank, dtype, device)],
    )


OPS = {
    op.name: op
    for op in [
        BenchOp("all_reduce", lambda n: 2 * (n - 1) / n, _all_reduce),
        BenchOp("all_gather", lambda n: (n - 1) / n, _all_gather),
        BenchOp("reduce_scatter", lambda n: (n - 1) / n, _reduce_scatter),
        BenchOp("all_to_all", lambda n: (n - 1) / n, _all_to_all),
        BenchOp("broadcast", lambda n: 1.0, _broadcast),
        BenchOp("reduce", lambda n: 1.0, _reduce),
    ]
}


def _sync(device: torch.device) -> Callable[[], None]:
    return (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)


def timed_loop(run: Callable[[], object], iters: int, sync: Callable[[], None]) -> list[float]:
    """Seconds of each of ``iters`` back-to-back calls (the harness: one clock read per call,
    nothing else)."""
    times = []
    clock = time.perf_counter
    for _ in range(iters):
        started = clock()
        run()
        sync()
        times.append(clock() - started)
    return times


def bare_loop(run: Callable[[], object], iters: int, sync: Callable[[], None]) -> float:
    """Mean seconds per call of a plain loop, the reference the harness is compared with."""
    started = time.perf_counter()
    for _ in range(iters):
        run()
    sync()
    return (time.perf_counter() - started) / iters


def wrong_elements(case: Case) -> int:
    expected = case.expected()
    if expected is None:
        return 0
    got = case.output
    if got.is_floating_point():
        # Sums of the small integers are exact in fp32/fp64; in 16-bit types they round once past
        # 256 (bf16) or 2048 (fp16), by at most a relative eps per addition.
        rtol = torch.finfo(got.dtype).eps * torch_dist.get_world_size()
        return int(
            (~torch.isclose(got.float(), expected.float(), rtol=rtol, atol=0.5)).sum().item()
        )
    return int((got != expected).sum().item())


def _slowest(times: list[float]) -> list[float]:
    """Per call, the slowest rank's time (a collective is done when its last rank is)."""
    if torch_dist.get_world_size() == 1:
        return times
    from rankwise import dist

    # Why: the table reports the job's time, not one rank's; one small gather per size, outside the
    # timing.
    return [max(call) for call in zip(*dist.all_gather_object(times))]


def measure(
    op: BenchOp, size: int, dtype: torch.dtype, device: torch.device, iters: int, warmup: int
) -> CommRow:
    """Time ``op`` at ``size`` bytes on every rank (collective: every rank calls it); the row rank 0
    reports."""
    from rankwise import dist

    rank, n = torch_dist.get_rank(), torch_dist.get_world_size()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    count = elements(op.name, size, n, itemsize)
    case = op.make(count, rank, n, dtype, device)
    sync = _sync(device)
    timed_loop(case.run, warmup, sync)
    times = _slowest(timed_loop(case.run, iters, sync))
    case.fill()
    case.run()
    sync()
    # Why: #wrong is the job's, summed over ranks (one small all_reduce, after the timing).
    wrong = int(dist.all_reduce(torch.tensor([wrong_elements(case)], device=device)).item())
    median = statistics.median(times)
    p90 = statistics.quantiles(times, n=10, method="inclusive")[-1] if len(times) > 1 else times[0]
    nbytes = count * itemsize
    algbw = nbytes / median / 1e9
    return {
        "op": op.name,
        "bytes": nbytes,
        "count": count,
        "dtype": str(dtype).removeprefix("torch."),
        "time_us": median * 1e6,
        "p90_us": p90 * 1e6,
        "algbw_GBps": algbw,
        "factor": op.factor(n),
        "busbw_GBps": algbw * op.factor(n),
        "wrong": wrong,
    }


def harness_overhead(device: torch.device) -> Harness:
    """The harness's cost on a 4-byte all_reduce: its loop against a bare one in alternating rounds.

    Small-message latency on a busy machine drifts by tens of percent from one second to
    the next, so each round's harness loop is compared with the bare loop right after it
    and the report takes the median of those paired ratios.
    """
    buf = torch.zeros(1, device=device)
    run, sync = (lambda: torch_dist.all_reduce(buf)), _sync(device)
    bare_loop(run, OVERHEAD_ITERS, sync)  # warm-up
    harness, bare = [], []
    for _ in range(OVERHEAD_ROUNDS):
        harness.append(statistics.fmean(timed_loop(run, OVERHEAD_ITERS, sync)))
        bare.append(bare_loop(run, OVERHEAD_ITERS, sync))
    ratios = [h / b for h, b in zip(harness, bare)]
    return {
        "harness_us": statistics.median(harness) * 1e6,
        "bare_us": statistics.median(bare) * 1e6,
        "overhead": statistics.median(ratios) - 1,
        "rounds": OVERHEAD_ROUNDS,
        "iters": OVERHEAD_ITERS,
        "ratios": ratios,
    }


@dataclass
class Settings:
    ops: list[str]
    sizes: list[int]
    dtype: str
    iters: int
    warmup: int
    backend: str
    timeout_s: float
    progress: bool = True


def sweep(
    settings: Settings, device: torch.device, emit: Callable[[CommRow], None] | None = None
) -> Sweep:
    """Every operation at every size on this rank (all ranks call it together); rank 0's dict has
    the results."""
    from tqdm import tqdm

    rank = torch_dist.get_rank()
    dtype = DTYPES[settings.dtype]
    n, itemsize = torch_dist.get_world_size(), torch.empty(0, dtype=dtype).element_size()
    # Small sizes can round to the same element count (all_gather's one element per rank): measure
    # each once.
    pairs = [
        (OPS[name], size)
        for name in settings.ops
        for size in dict.fromkeys(elements(name, s, n, itemsize) * itemsize for s in settings.sizes)
    ]
    rows: list[CommRow] = []
    with tqdm(
        total=len(pairs),
        desc="comm bench",
        unit="case",
        disable=rank != 0 or not settings.progress,
        dynamic_ncols=True,
        file=sys.stderr,
    ) as bar:
        for op, size in pairs:
            bar.set_postfix_str(f"{op.name} {size} B")
            row = measure(op, size, dtype, device, settings.iters, settings.warmup)
            rows.append(row)
            if rank == 0 and emit:
                emit(row)
            bar.update()
    overhead = harness_overhead(device)
    return {
        "world_size": torch_dist.get_world_size(),
        "backend": settings.backend,
        "device": device.type,
        "results": rows,
        "harness": overhead,
    }


def on_rank(env: ProcessEnv, device: torch.device, settings: Settings) -> Sweep:
    """One rank of ``rankwise comm bench`` (:func:`~rankwise.tools.harness.run_on_ranks`); rank 0's
    measurements reach the command."""
    measured = sweep(settings, device)
    measured["nnodes"] = env.world_size // env.local_world_size
    return measured


def settings(
    ops: str,
    min_bytes: int,
    max_bytes: int,
    dtype: str,
    iters: int,
    warmup: int,
    backend: str,
    timeout_s: float,
    progress: bool = True,
) -> Settings:
    """What to measure, from the command's flags (``ops``: comma-separated), or a refusal naming the
    flag."""
    names = [name.strip() for name in ops.split(",") if name.strip()]
    unknown = [name for name in names if name not in OPS]
    if unknown or not names:
        raise ConfigError(
            f"--ops: unknown operation(s) {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(OPS)}"
        )
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ConfigError(
            f"--min-bytes {min_bytes} and --max-bytes {max_bytes}: need 1 <= min <= max"
        )
    if iters < 1 or warmup < 0:
        raise ConfigError("--iters must be at least 1 and --warmup at least 0")
    return Settings(
        names,
        sizes_between(min_bytes, max_bytes),
        dtype,
        iters,
        warmup,
        backend,
        timeout_s,
        progress=progress,
    )


def run(
    settings: Settings,
    layout: NodeLayout,
    *,
    out: str | None = None,
    ceilings: bool = True,
    as_json: bool = False,
) -> int:
    """``rankwise comm bench``: measure, then (on node 0) print and write the report under ``out``;
    ``ceilings``: this machine's TCP and memcpy ceilings too; exit 1 when an element came back
    wrong."""
    from rankwise.tools.comm import ceilings as machine_ceilings
    from rankwise.tools.comm import report
    from rankwise.tools.harness import run_on_ranks
    from rankwise.tools.machine import machine

    out_dir = Path(out or f"runs/comm-{time.strftime('%Y%m%d-%H%M%S')}").absolute()
    limits = {}
    if ceilings:  # before the ranks start, so nothing competes with the measurements
        if layout.node_rank == 0:
            log.info(
                "measuring this machine's ceilings (loopback TCP, memcpy) ...",
                stderr=True,
                every_rank=True,
            )
            limits = machine_ceilings.measure()
        if layout.nnodes > 1 and layout.node_rank <= 1:
            # several nodes: check_layout required --master-port
            assert layout.master_port is not None
            log.info("measuring TCP between node 0 and node 1 ...", stderr=True, every_rank=True)
            try:
                limits |= machine_ceilings.between_nodes(
                    layout.node_rank, layout.master_addr, layout.master_port + 1, layout.timeout_s
                )
            except (OSError, OverflowError) as e:
                # the collectives can still run: go on without this ceiling
                log.warning(
                    f"rankwise comm bench: node {layout.node_rank}: no TCP ceiling between the "
                    f"nodes (port {layout.master_port + 1}): {e}",
                    every_rank=True,
                )
    measured = run_on_ranks(on_rank, (settings,), layout, settings.backend)
    if measured is None:
        log.info(
            f"node {layout.node_rank}: this node's ranks took part; node 0 printed and wrote the "
            "results",
            every_rank=True,
        )
        return 0
    result: CommResult = {
        **cast(Sweep, measured),
        "settings": asdict(settings),
        "ceilings": limits,
        "machine": machine(),
    }
    result["analysis"] = report.analyse(result)
    paths = report.write(result, out_dir)
    # The command's output (the table, the files, the JSON): printed whatever the logging level.
    print(report.table(result))
    print(f"\nwrote {', '.join(str(p) for p in paths)}")
    wrong = sum(row["wrong"] for row in result["results"])
    if as_json:
        print(json.dumps({"out": str(out_dir), "wrong": wrong, **result["analysis"]}))
    if wrong:
        log.error(f"rankwise comm bench: {wrong} element(s) came back wrong; see the #wrong column")
    return 1 if wrong else 0
