"""Every operation ``rankwise comm demo`` shows, with its expected result computed without
communicating.

An operation returns an :class:`~rankwise.tools.comm.context.Outcome`: this rank's tensor (or
object) before and after, and the expected result (``None`` where the result is unspecified on
this rank, e.g. ``reduce`` on a rank other than the destination).

Where the backend lacks an operation (NCCL has no bitwise reductions, older gloo had no
``AVG``), :meth:`Ctx.call` runs its composition from simpler operations instead and says
so; ``composed=True`` runs every composition, to show them and to check them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as torch_dist

from rankwise.tools.comm.context import (
    BITWISE,
    LACKING,
    REDUCTIONS,
    ROOT,
    UNSUPPORTED,
    VALUES,
    Ctx,
    Op,
    Outcome,
    all_gather_list,
    everyone,
    reduce_dtype,
    reference_reduce,
)
from rankwise.tools.comm.object_ops import (
    all_gather_object,
    barrier,
    broadcast_object_list,
    gather_object,
    scatter_object_list,
)

__all__ = [
    "LACKING",
    "OPS",
    "UNSUPPORTED",
    "Ctx",
    "Op",
    "Outcome",
    "all_gather_tensor",
    "reduce_scatter_tensor",
    "select",
]


# -- point to point --------------------------------------------------------------------------------


def _send_recv(c: Ctx) -> Outcome:
    mine, got = c.on_device(c.value(c.rank)), torch.zeros(VALUES, device=c.device)
    after, before = (c.rank + 1) % c.world_size, (c.rank - 1) % c.world_size
    # Why this order: a blocking send may wait for its matching recv. Rank 0 sends first and every
    # other rank receives first, so the ring unwinds from rank 0 instead of deadlocking.
    if c.rank == 0:
        torch_dist.send(mine, after)
        torch_dist.recv(got, before)
    else:
        torch_dist.recv(got, before)
        torch_dist.send(mine, after)
    return Outcome(mine, got, c.value(before))


def _isend_irecv(c: Ctx) -> Outcome:
    mine, got = c.on_device(c.value(c.rank)), torch.zeros(VALUES, device=c.device)
    to, source = (c.rank - 1) % c.world_size, (c.rank + 1) % c.world_size
    # Non-blocking: every rank posts its send and its receive together, then waits for both.
    # Batched, so NCCL sets up both peer connections at once instead of each rank blocking on its
    # first pair.
    for request in torch_dist.batch_isend_irecv(
        [
            torch_dist.P2POp(torch_dist.isend, mine, to),
            torch_dist.P2POp(torch_dist.irecv, got, source),
        ]
    ):
        request.wait()
    return Outcome(mine, got, c.value(source))


# -- rooted collectives ----------------------------------------------------------------------------


def _broadcast(c: Ctx) -> Outcome:
    before = c.value(c.rank)
    tensor = c.on_device(before)

    def composed() -> None:
        if c.rank == ROOT:
            for peer in range(c.world_size):
                if peer != ROOT:
                    torch_dist.send(tensor, peer)
        else:
            torch_dist.recv(tensor, ROOT)

    c.call(
        lambda: torch_dist.broadcast(tensor, src=ROOT),
        composed,
        f"rank {ROOT} sends to each rank in turn",
    )
    return Outcome(before, tensor, c.value(ROOT))


def _parts(c: Ctx, uneven: bool) -> list[torch.Tensor]:
    """What the root scatters: part i for rank i (i + 1 values when ``uneven``)."""
    return [c.value(i, i + 1 if uneven else VALUES) for i in range(c.world_size)]


def _scatter(c: Ctx, uneven: bool = False) -> Outcome:
    # every rank builds them: the root sends them, the others check against them
    parts = _parts(c, uneven)
    # the receive buffer's size, agreed in advance (the padding)
    longest = max(len(p) for p in parts)
    received = torch.zeros(longest, device=c.device)
    padded = [c.on_device(torch.nn.functional.pad(p, (0, longest - len(p)))) for p in parts]
    length = torch.zeros(1, dtype=torch.int64, device=c.device)

    def native() -> None:
        # scatter needs equal shapes: send each rank its length, then the parts padded to the
        # longest
        if uneven:
            lengths = [torch.tensor([len(p)], device=c.device) for p in parts]
            torch_dist.scatter(length, lengths if c.rank == ROOT else None, src=ROOT)
        torch_dist.scatter(received, padded if c.rank == ROOT else None, src=ROOT)

    def composed() -> None:
        if c.rank == ROOT:
            for peer in range(c.world_size):
                if peer != ROOT:
                    torch_dist.send(torch.tensor([len(parts[peer])], device=c.device), peer)
                    torch_dist.send(padded[peer], peer)
            length.fill_(len(parts[ROOT]))
            received.copy_(padded[ROOT])
        else:
            torch_dist.recv(length, ROOT)
            torch_dist.recv(received, ROOT)

    c.call(native, composed, f"rank {ROOT} sends each rank its part")
    kept = int(length.item()) if uneven or c.how != "native" else longest
    return Outcome(parts if c.rank == ROOT else "(nothing)", received[:kept], parts[c.rank])


def _gather(c: Ctx, uneven: bool = False) -> Outcome:
    mine = c.value(c.rank, c.rank + 1 if uneven else VALUES)
    # every rank knows the longest part: the last rank's
    longest = c.world_size if uneven else VALUES
    padded = c.on_device(torch.nn.functional.pad(mine, (0, longest - len(mine))))
    lengths = [torch.zeros(1, dtype=torch.int64, device=c.device) for _ in range(c.world_size)]
    slots = [torch.zeros(longest, device=c.device) for _ in range(c.world_size)]
    root = c.rank == ROOT

    def native() -> None:
        # gather needs equal shapes: gather the lengths, then the parts padded to the longest
        if uneven:
            torch_dist.gather(
                torch.tensor([len(mine)], device=c.device), lengths if root else None, dst=ROOT
            )
        torch_dist.gather(padded, slots if root else None, dst=ROOT)

    def composed() -> None:
        if root:
            for peer in range(c.world_size):
                if peer == ROOT:
                    lengths[peer].fill_(len(mine))
                    slots[peer].copy_(padded)
                else:
                    torch_dist.recv(lengths[peer], peer)
                    torch_dist.recv(slots[peer], peer)
        else:
            torch_dist.send(torch.tensor([len(mine)], device=c.device), ROOT)
            torch_dist.send(padded, ROOT)

    c.call(native, composed, f"each rank sends its part to rank {ROOT}")
    if not root:
        return Outcome(mine, "(unspecified)", None)
    if not uneven and c.how == "native":
        lengths = [torch.tensor([longest])] * c.world_size
    gathered = [slot[: int(n.item())] for slot, n in zip(slots, lengths)]
    return Outcome(
        mine, gathered, [c.value(r, r + 1 if uneven else VALUES) for r in range(c.world_size)]
    )


def _reduce(op: str) -> Callable[[Ctx], Outcome]:
    def run(c: Ctx) -> Outcome:
        dtype = reduce_dtype(op)
        before = c.value(c.rank, dtype=dtype)
        tensor = c.on_device(before)

        def composed() -> None:
            reduced = reference_reduce(op, all_gather_list(c, tensor))
            if c.rank == ROOT:
                tensor.copy_(reduced)

        c.call(
            lambda: torch_dist.reduce(tensor, dst=ROOT, op=getattr(torch_dist.ReduceOp, op)),
            composed,
            f"all_gather, then rank {ROOT} reduces locally",
        )
        if c.rank != ROOT:
            return Outcome(before, "(unspecified)", None)
        return Outcome(before, tensor, reference_reduce(op, everyone(c, dtype=dtype)))

    return run


# -- collectives every rank receives ---------------------------------------------------------------


def _all_reduce(op: str) -> Callable[[Ctx], Outcome]:
    def run(c: Ctx) -> Outcome:
        dtype = reduce_dtype(op)
        before = c.value(c.rank, dtype=dtype)
        tensor = c.on_device(before)
        c.call(
            lambda: torch_dist.all_reduce(tensor, op=getattr(torch_dist.ReduceOp, op)),
            lambda: tensor.copy_(reference_reduce(op, all_gather_list(c, tensor))),
            "all_gather, then every rank reduces locally",
        )
        return Outcome(before, tensor, reference_reduce(op, everyone(c, dtype=dtype)))

    return run


def _all_gather_each_broadcasts(c: Ctx, mine: torch.Tensor, slots: list[torch.Tensor]) -> None:
    for source in range(c.world_size):
        if source == c.rank:
            slots[source].copy_(mine)
        torch_dist.broadcast(slots[source], src=source)


def _all_gather(c: Ctx) -> Outcome:
    mine = c.on_device(c.value(c.rank))
    slots = [torch.zeros(VALUES, device=c.device) for _ in range(c.world_size)]
    c.call(
        lambda: torch_dist.all_gather(slots, mine),
        lambda: _all_gather_each_broadcasts(c, mine, slots),
        "each rank broadcasts its tensor in turn",
    )
    return Outcome(mine, slots, everyone(c))


def all_gather_tensor(output: torch.Tensor, tensor: torch.Tensor) -> None:
    """Gather into one tensor (``all_gather_single`` in torch ≥ 2.13, ``all_gather_into_tensor``
    before)."""
    (getattr(torch_dist, "all_gather_single", None) or torch_dist.all_gather_into_tensor)(
        output, tensor
    )


def reduce_scatter_tensor(output: torch.Tensor, tensor: torch.Tensor) -> None:
    """Sum and scatter one tensor (``reduce_scatter_single`` in torch ≥ 2.13,
    ``reduce_scatter_tensor`` before)."""
    (getattr(torch_dist, "reduce_scatter_single", None) or torch_dist.reduce_scatter_tensor)(
        output, tensor
    )


def _all_gather_into_tensor(c: Ctx) -> Outcome:
    mine = c.on_device(c.value(c.rank))
    output = torch.zeros(VALUES * c.world_size, device=c.device)

    def composed() -> None:
        slots = list(output.chunk(c.world_size))
        _all_gather_each_broadcasts(c, mine, slots)

    c.call(
        lambda: all_gather_tensor(output, mine),
        composed,
        "each rank broadcasts its tensor into its slice",
    )
    return Outcome(mine, output, torch.cat(everyone(c)))


def _chunks_in(c: Ctx, rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s input to reduce_scatter / all_to_all: one 2-value chunk for every rank."""
    return list(c.value(rank, 2 * c.world_size).chunk(c.world_size))


def _reduce_scatter(c: Ctx, single: bool = False) -> Outcome:
    chunks = [c.on_device(chunk) for chunk in _chunks_in(c, c.rank)]
    whole = torch.cat(chunks)
    output = torch.zeros(2, device=c.device)

    def composed() -> None:
        summed = whole.clone()
        torch_dist.all_reduce(summed)
        output.copy_(summed.chunk(c.world_size)[c.rank])

    native = (
        (lambda: reduce_scatter_tensor(output, whole))
        if single
        else (lambda: torch_dist.reduce_scatter(output, chunks))
    )
    c.call(native, composed, "all_reduce, then each rank keeps its chunk")
    expected = reference_reduce("SUM", [_chunks_in(c, r)[c.rank] for r in range(c.world_size)])
    return Outcome(whole if single else chunks, output, expected)


def _exchange(c: Ctx, outgoing: list[torch.Tensor], incoming: list[torch.Tensor]) -> None:
    """all_to_all from point-to-point: part j of ``outgoing`` to rank j, part j of ``incoming`` from
    rank j."""
    incoming[c.rank].copy_(outgoing[c.rank])
    peers = [peer for peer in range(c.world_size) if peer != c.rank]
    pairs = [torch_dist.P2POp(torch_dist.isend, outgoing[peer], peer) for peer in peers] + [
        torch_dist.P2POp(torch_dist.irecv, incoming[peer], peer) for peer in peers
    ]
    # One batch: every send and receive posted together, so no rank waits on a peer that is itself
    # waiting.
    for request in torch_dist.batch_isend_irecv(pairs):
        request.wait()


def _all_to_all(c: Ctx) -> Outcome:
    outgoing = [c.on_device(chunk) for chunk in _chunks_in(c, c.rank)]
    incoming = [torch.zeros(2, device=c.device) for _ in range(c.world_size)]
    c.call(
        lambda: torch_dist.all_to_all(incoming, outgoing),
        lambda: _exchange(c, outgoing, incoming),
        "isend / irecv with every peer",
    )
    return Outcome(outgoing, incoming, [_chunks_in(c, r)[c.rank] for r in range(c.world_size)])


def _uneven_split(c: Ctx, rank: int) -> list[torch.Tensor]:
    """Rank ``rank``'s all_to_all_single input, split unevenly: rank j gets j + 1 values."""
    sizes = [j + 1 for j in range(c.world_size)]
    return list(c.value(rank, sum(sizes)).split(sizes))


def _all_to_all_single(c: Ctx) -> Outcome:
    outgoing = [c.on_device(part) for part in _uneven_split(c, c.rank)]
    send_sizes = [len(part) for part in outgoing]
    receive_sizes = [c.rank + 1] * c.world_size
    output = torch.zeros(sum(receive_sizes), device=c.device)
    whole = torch.cat(outgoing)
    c.call(
        lambda: torch_dist.all_to_all_single(output, whole, receive_sizes, send_sizes),
        lambda: _exchange(c, outgoing, list(output.split(receive_sizes))),
        "isend / irecv with every peer",
    )
    return Outcome(
        whole, output, torch.cat([_uneven_split(c, r)[c.rank] for r in range(c.world_size)])
    )


OPS: list[Op] = [
    Op(
        "send/recv",
        "blocking point-to-point: each rank sends its tensor to the next rank in a ring",
        _send_recv,
    ),
    Op(
        "isend/irecv",
        "non-blocking point-to-point: each rank sends to the previous rank, receives from the next",
        _isend_irecv,
    ),
    Op("broadcast", f"every rank ends with rank {ROOT}'s tensor", _broadcast),
    Op("scatter", f"rank {ROOT} holds one part per rank; rank i receives part i", _scatter),
    Op(
        "scatter uneven",
        f"rank {ROOT}'s part i has i + 1 values: lengths first, then parts padded to the longest",
        functools.partial(_scatter, uneven=True),
    ),
    Op("gather", f"rank {ROOT} receives every rank's tensor, in rank order", _gather),
    Op(
        "gather uneven",
        "rank i sends i + 1 values: lengths gathered first, parts padded to the longest",
        functools.partial(_gather, uneven=True),
    ),
    *[
        Op(
            f"reduce {op}",
            f"rank {ROOT} receives the elementwise {op} of every rank's tensor"
            + (" (int64)" if op in BITWISE else ""),
            _reduce(op),
        )
        for op in REDUCTIONS
    ],
    *[
        Op(
            f"all_reduce {op}",
            f"every rank receives the elementwise {op} of every rank's tensor"
            + (" (int64)" if op in BITWISE else ""),
            _all_reduce(op),
        )
        for op in REDUCTIONS
    ],
    Op("all_gather", "every rank receives a list of every rank's tensor", _all_gather),
    Op(
        "all_gather tensor",
        "the same into one preallocated tensor (all_gather_single)",
        _all_gather_into_tensor,
    ),
    Op(
        "reduce_scatter",
        "each rank holds one chunk per rank; rank i receives the sum of every rank's chunk i",
        _reduce_scatter,
    ),
    Op(
        "reduce_scatter tensor",
        "the same from one tensor (reduce_scatter_single)",
        functools.partial(_reduce_scatter, single=True),
    ),
    Op(
        "all_to_all",
        "rank i sends its chunk j to rank j and receives chunk i from every rank",
        _all_to_all,
    ),
    Op(
        "all_to_all_single uneven",
        "one tensor in, one out; rank j receives j + 1 values from every rank",
        _all_to_all_single,
    ),
    Op(
        "barrier",
        "no rank leaves before every rank has arrived (arrivals counted in the store)",
        barrier,
    ),
    Op(
        "broadcast_object_list",
        f"every rank ends with rank {ROOT}'s Python objects",
        broadcast_object_list,
    ),
    Op("all_gather_object", "every rank receives every rank's Python object", all_gather_object),
    Op("gather_object", f"rank {ROOT} receives every rank's Python object", gather_object),
    Op(
        "scatter_object_list",
        f"rank {ROOT} holds one object per rank; rank i receives object i",
        scatter_object_list,
    ),
]


def select(names: list[str] | None) -> list[Op]:
    """The operations named (``reduce`` selects every ``reduce <OP>``), every one when ``names`` is
    empty."""
    if not names:
        return list(OPS)
    chosen = []
    for name in names:
        matching = [op for op in OPS if op.name == name or op.name.split(" ")[0] == name]
        if not matching:
            raise ValueError(
                f"unknown operation {name!r}; choose from: "
                + ", ".join(dict.fromkeys(op.name.split(" ")[0] for op in OPS))
            )
        chosen += [op for op in matching if op not in chosen]
    return chosen
