"""``rankwise comm demo``: every collective on every rank, shown as one ordered block per operation.

Each rank runs the operation, compares its result with the independently computed one
(:mod:`rankwise.tools.comm.ops`) and sends rank 0 a printable view of its tensor before and
after; rank 0 prints the views in rank order (never interleaved) with PASS / FAIL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from rankwise.logs import get_logger
from rankwise.tools.comm.ops import LACKING, UNSUPPORTED, Ctx, Op

if TYPE_CHECKING:
    from rankwise.process import ProcessEnv
    from rankwise.tools.harness import NodeLayout

log = get_logger(__name__)

PASS, FAIL, UNAVAILABLE = "PASS", "FAIL", "n/a"


@dataclass
class RankView:
    rank: int
    before: str
    after: str
    expected: str | None
    ok: bool
    how: str
    composed: bool


@dataclass
class OpResult:
    name: str
    status: str
    how: str
    composed: bool
    views: list[RankView]


def matches(after: Any, expected: Any) -> bool:
    """Whether ``after`` is ``expected``: tensors compared by shape and value (exactly for
    integers)."""
    if expected is None:
        return True
    if isinstance(expected, torch.Tensor):
        if not isinstance(after, torch.Tensor) or after.shape != expected.shape:
            return False
        after = after.detach().cpu().to(expected.dtype)
        if expected.is_floating_point():
            return torch.allclose(after, expected, rtol=1e-6, atol=1e-6)
        return torch.equal(after, expected)
    if isinstance(expected, list):
        return (
            isinstance(after, list)
            and len(after) == len(expected)
            and all(map(matches, after, expected))
        )
    return after == expected


def show(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return (
            "["
            + ", ".join(
                f"{v:g}" if isinstance(v, float) else str(v) for v in value.detach().cpu().tolist()
            )
            + "]"
        )
    if isinstance(value, list):
        return "[" + ", ".join(repr(v) if isinstance(v, str) else show(v) for v in value) + "]"
    if isinstance(value, str):
        return value
    return repr(value)


def run_op(ctx: Ctx, op: Op) -> RankView:
    """Run one operation on this rank; an operation the backend lacks, with no composition, reads
    n/a."""
    ctx.how, ctx.composed_run = "native", False
    try:
        outcome = op.run(ctx)
    except LACKING as e:
        if not UNSUPPORTED.search(str(e)):
            raise
        return RankView(
            ctx.rank,
            "",
            "",
            None,
            True,
            f"not available on {ctx.backend}: {str(e).splitlines()[0]}",
            False,
        )
    expected = None if outcome.expected is None else show(outcome.expected)
    return RankView(
        ctx.rank,
        show(outcome.before),
        show(outcome.after),
        expected,
        matches(outcome.after, outcome.expected),
        ctx.how,
        ctx.composed_run,
    )


def status_of(views: list[RankView]) -> str:
    if any(v.how.startswith("not available") for v in views):
        return UNAVAILABLE
    return PASS if all(v.ok for v in views) else FAIL


def render(op: Op, result: OpResult) -> str:
    lines = [f"{result.status:<4}  {op.name}  {op.what}"]
    if result.status == UNAVAILABLE:
        return "\n".join(lines + [f"      {result.how}"])
    width = max(len(v.before) for v in result.views)
    for v in result.views:
        line = f"      rank {v.rank:<3} before {v.before:<{width}}  after {v.after}"
        if not v.ok:
            line += f"  expected {v.expected}  <- wrong"
        lines.append(line)
    if result.how != "native":
        lines.append(f"      [{result.how}]")
    return "\n".join(lines)


def run_all(ctx: Ctx, ops: list[Op], emit: Callable[[str], None] = print) -> list[OpResult]:
    """Every operation in turn; rank 0 prints each block as soon as every rank has reported (returns
    the results)."""
    from rankwise import dist
    from rankwise.testing import faults

    # test-only: a rank failing after operation N (RANKWISE_TEST_FAULT, step=N)
    fault = faults.configured()
    results = []
    for number, op in enumerate(ops, start=1):
        view = run_op(ctx, op)
        faults.at_step_end(fault, ctx.rank, number)
        # Why: rank 0 prints every rank's view in order, so it needs them all (a small object
        # gather).
        views = (
            [RankView(**v) for v in dist.all_gather_object(asdict(view))]
            if ctx.world_size > 1
            else [view]
        )
        result = OpResult(op.name, status_of(views), views[0].how, views[0].composed, views)
        results.append(result)
        if ctx.rank == 0:
            emit(render(op, result))
    return results


def summary(results: list[OpResult]) -> str:
    failed = [r.name for r in results if r.status == FAIL]
    unavailable = [r.name for r in results if r.status == UNAVAILABLE]
    composed = [r.name for r in results if r.composed]
    text = f"{len(results) - len(failed) - len(unavailable)} of {len(results)} operations passed"
    if composed:
        text += f"; {len(composed)} ran composed from simpler operations"
    if unavailable:
        text += f"; not available on this backend: {', '.join(unavailable)}"
    if failed:
        text += f"; FAILED: {', '.join(failed)}"
    return text


def on_rank(
    env: ProcessEnv, device: torch.device, names: list[str] | None, composed: bool, backend: str
) -> list[dict]:
    """One rank of ``rankwise comm demo`` (:func:`~rankwise.tools.harness.run_on_ranks`): rank 0
    prints every block as it completes; returns the results (rank 0's reach the command)."""
    from rankwise.tools.comm import ops as comm_ops

    ctx = Ctx(env.rank, env.world_size, device, backend, composed=composed)
    # The demo's output (what each operation did), printed by the ranks whatever the logging level.
    if env.rank == 0:
        print(
            f"rankwise comm demo: {env.world_size} ranks on {backend} ({device.type}), "
            f"{env.world_size // env.local_world_size} node(s), torch {torch.__version__}\n",
            flush=True,
        )
    results = run_all(ctx, comm_ops.select(names), emit=lambda text: print(text, flush=True))
    if env.rank == 0:
        print("\n" + summary(results), flush=True)
    return [asdict(r) for r in results]


def run(names: list[str] | None, composed: bool, layout: NodeLayout, backend: str) -> int:
    """``rankwise comm demo`` of the operations ``names`` select (``None``: every one; ``composed``:
    each built from simpler ones): exit 1 when any operation returned a wrong result."""
    from rankwise.errors import ConfigError
    from rankwise.tools.comm import ops
    from rankwise.tools.harness import run_on_ranks

    try:
        ops.select(names)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    results = run_on_ranks(on_rank, (names, composed, backend), layout, backend)
    if results is None:
        log.info(
            f"node {layout.node_rank}: this node's ranks took part; node 0 printed the results",
            every_rank=True,
        )
        return 0
    failed = [r["name"] for r in results if r["status"] == FAIL]
    if failed:
        log.error(
            f"rankwise comm demo: {len(failed)} operation(s) returned a wrong result: "
            f"{', '.join(failed)}"
        )
    return 1 if failed else 0
