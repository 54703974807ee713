"""FSDP's memory, measured on fake ranks: rankwise's ``fsdp`` wrapping of the captured model at
world size N, in one process, with torch's own ``FSDPMemTracker``.

A process group of the ``fake`` backend (``torch.testing._internal.distributed.fake_pg``:
collectives return at once, their outputs of the right shape) stands for N ranks; the copy of the
captured model is sharded exactly as the ``fsdp`` strategy shards it (each transformer layer, then
the root, ``fully_shard`` on a one-dimensional mesh), under the capture's ``FakeTensorMode`` so that
the shards, the all-gathered parameters and every activation are fake. ``FSDPMemTracker``
(``torch.distributed._tools.fsdp2_mem_tracker``) then follows two optimizer steps by kind: sharded
and unsharded parameters and gradients, the all-gather and reduce-scatter buffers, activations,
temporaries, optimizer state.  The second step is the steady one (the optimizer's state exists from
its start).

On gloo (a plan for this machine's CPU) the real ranks hold more than the fake ones, measured in
profiler traces of examples/causal_lm.py and examples/builtin_model.py at 2 ranks: c10d's gloo
reduce-scatter keeps a clone of its input (a layer's unsharded gradients) until the next one, and
each micro-batch's backward-prefetch all-gather output (a layer's unsharded parameters) is still
alive from the step before.  ``gloo=True`` adds both, for the largest layer: (micro-batches + 1) x
its parameter bytes, as buffers.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as torch_dist
from torch.distributed.fsdp import FSDPModule

from rankwise.compat.fsdp_tools import chunks_when_read, fake_store, mem_tracker
from rankwise.strategies.blocks import checkpoint_blocks, is_checkpointed, transformer_blocks
from rankwise.strategies.fsdp import rebind_optimizer, shard
from rankwise.tools.plan.capture import Capture, loss_of
from rankwise.tools.plan.fake import fake_copy
from rankwise.tools.plan.fake_step import resized
from rankwise.tools.plan.rank_memory import KINDS, Memory
from rankwise.tools.plan.reads import DataDependentOutputException, ValueReads

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

KIND_OF = {
    "Sharded Param": "parameters",
    "Sharded Grad": "gradients",
    "Unsharded Grad": "gradients",
    "OptState": "optimizer",
    "Activation": "activations",
    "Temp": "activations",
    "Inputs": "activations",
    "Buffer": "activations",
    "Unsharded Param": "buffers",
    "All Gather": "buffers",
    "Reduce Scatter": "buffers",
}
"""FSDPMemTracker's kinds (``_FSDPRefType`` values) as the plan's rows."""


@contextlib.contextmanager
def fake_ranks(world_size: int) -> Iterator[None]:
    """A process group of ``world_size`` fake ranks in this process (this process is rank 0), closed
    after."""
    if torch_dist.is_initialized():
        raise RuntimeError(
            "rankwise plan measures FSDP on fake ranks: this process already has a process group"
        )
    # (each init_process_group wraps it to prefix "[rank0]:", once more every time)
    hook = sys.excepthook
    torch_dist.init_process_group("fake", store=fake_store()(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        torch_dist.destroy_process_group()
        sys.excepthook = hook


def _by_kind(snapshot: dict) -> dict[str, int]:
    rows = dict.fromkeys(KINDS, 0)
    for device_snapshot in snapshot.values():
        for kind, nbytes in device_snapshot.items():
            name = getattr(kind, "value", kind)
            if name in KIND_OF:
                rows[KIND_OF[name]] += nbytes
    return rows


def fsdp(
    capture: Capture,
    rows: int,
    world_size: int,
    *,
    autocast: torch.dtype | None = None,
    checkpointing: bool = False,
    grad_accum: int = 1,
    gloo: bool = False,
) -> Memory:
    """One rank's memory under ``fsdp`` at ``world_size`` ranks, measured as the module's docstring
    says (``gloo``: with gloo's own copies added)."""
    from torch.distributed.device_mesh import init_device_mesh

    use_autocast = autocast is not None and capture.autocast

    def measured(reads: ValueReads | None) -> tuple[Memory, int]:
        model, optimizer = fake_copy(capture.model, capture.optimizer)
        if checkpointing and not is_checkpointed(model):
            checkpoint_blocks(model)
        model.train()
        args, kwargs = resized(capture, rows)
        blocks = transformer_blocks(model)
        largest = max(
            (sum(p.numel() * p.element_size() for p in block.parameters()) for block in blocks),
            default=0,
        )
        # (FSDP2's per-rank views of each parameter made only for the rank it keeps: all N of them
        # were half the 8B plan's time at 512 ranks)
        with fake_ranks(world_size), chunks_when_read():
            # (its rank table is real: outside the fake mode)
            mesh = init_device_mesh("cpu", (world_size,))
            with capture.mode, reads if reads is not None else contextlib.nullcontext():
                memory = _sharded(
                    model,
                    optimizer,
                    mesh,
                    args,
                    kwargs,
                    grad_accum,
                    autocast if use_autocast else None,
                )
        return memory, largest

    try:
        memory, largest = measured(None)
    except DataDependentOutputException:
        # (a model that reads a value its fake tensors lack: again, each read answered 0)
        reads = ValueReads()
        memory, largest = measured(reads)
        memory.notes.append(
            f"the model read {reads.answered} value(s) of its fake tensors (torch's nn.Transformer "
            "does, to check that its mask is causal): each was answered 0 (False), so a branch on "
            "one took its false side"
        )
    if gloo and world_size > 1:
        # (the gradients reduce in fp32; the parameters gather in the policy's dtype)
        gathered = largest * autocast.itemsize // 4 if use_autocast and autocast else largest
        memory.at_peak["buffers"] += largest + grad_accum * gathered
        memory.source += (
            f"; + gloo's reduce-scatter clone and {grad_accum} kept backward-prefetch gather(s) of "
            "the largest layer (measured on gloo)"
        )
    return memory


SHARDED_KINDS = ("parameters", "gradients", "optimizer")


def _rows_kept(shapes: list[torch.Size], world: int, *, gathered: bool = False) -> int:
    """Elements of one rank's FSDP2 shards of parameters of ``shapes`` at ``world`` ranks: each cut
    along its first dimension, ⌈rows/N⌉ rows a rank (the last ranks' padded); ``gathered``: the
    padded whole, ⌈rows/N⌉ x N rows, as an all-gather assembles it."""
    total = 0
    for shape in shapes:
        rows = shape[0] if len(shape) else 1
        kept = math.ceil(rows / world) * (world if gathered else 1)
        total += kept * (math.prod(shape) // rows if rows else 0)
    return total


def at_world(measured: Memory, measured_world: int, world: int, shapes: list[torch.Size]) -> Memory:
    """FSDP's memory at ``world`` ranks from its measurement at ``measured_world`` ranks with the
    same rows a rank, precision and checkpointing, instead of another fake-rank step (20 CPU-s at
    Llama 3 8B's size).  The shards (parameters, gradients, optimizer state), held and at the peak,
    scale with their padded sizes; the gathered parameters and communication buffers with the
    padded whole; the activations are the same.  Against fake ranks measured at each world size
    (the accounting model at bf16 and fp32, from 2 ranks to 3-64): the peak within 1.7 %, the
    difference all padding; the shards and optimizer state held to the byte
    (``tests/tools/plan/test_fsdp_fake_ranks.py``)."""
    kept = _rows_kept(shapes, measured_world)
    shards = _rows_kept(shapes, world) / kept
    whole = _rows_kept(shapes, world, gathered=True) / _rows_kept(
        shapes, measured_world, gathered=True
    )
    # The optimizer's state: bytes per shard element (its moments), plus what every rank keeps
    # whole whatever the world size (a step count per parameter, smaller than one element a row).
    per_element, whole_state = divmod(measured.optimizer, kept)
    optimizer = per_element * _rows_kept(shapes, world) + whole_state
    scale = {kind: shards for kind in SHARDED_KINDS} | {"buffers": whole}
    at_peak = {
        kind: round(nbytes * scale.get(kind, 1.0)) for kind, nbytes in measured.at_peak.items()
    }
    # (the state at the peak is the state held, plus the step's temporaries where it peaks there)
    at_peak["optimizer"] = optimizer + round(
        (measured.at_peak["optimizer"] - measured.optimizer) * shards
    )
    return Memory(
        round(measured.parameters * shards),
        round(measured.gradients * shards),
        optimizer,
        at_peak,
        f"{measured.source}; at {world} ranks from the measurement at {measured_world}: the "
        "shards scaled by their padded sizes, the gathered buffers by the padded whole",
        list(measured.notes),
    )


def _sharded(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    mesh: DeviceMesh,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    grad_accum: int,
    autocast: torch.dtype | None,
) -> Memory:
    names = {id(p): name for name, p in model.named_parameters()}
    # (as rankwise's fsdp shards it: gathered in the autocast dtype, the mixed-precision policy)
    shard(model, mesh, autocast or torch.float32)
    assert isinstance(model, FSDPModule)  # (fully_shard gives the root FSDP's class)
    optimizer = rebind_optimizer(optimizer, model, names)
    tracker = mem_tracker()(model, optimizer)
    tracker.track_inputs((args, kwargs))

    def step() -> None:
        for micro in range(grad_accum):
            # (as rankwise's fsdp no_sync: the reduce-scatter only on a step's last micro-batch)
            model.set_requires_gradient_sync(micro == grad_accum - 1)
            # (its per-module records allow one forward each; the peak is kept)
            tracker.reset_mod_stats()
            with torch.autocast(
                "cpu", dtype=autocast or torch.bfloat16, enabled=autocast is not None
            ):
                loss = loss_of(model(*args, **kwargs))
            loss.backward()
            del loss
        optimizer.step()

    # An untracked optimizer step first, on zero gradients: DTensor computes each sharded op's
    # output spec once per process and shapes, under the plan's own fake mode, which the tracker
    # cannot tell from the step's own tensors; so the first measurement of a shape counted those
    # (measured: a peak at the optimizer step of 15 times the shards' bytes, the activations
    # missed).  Cached from here on, and the optimizer's state made: one tracked step is a steady
    # one.  The passes need no warming (FSDP2 computes on the gathered plain tensors): a whole
    # untracked step gave the 8B plan the same rows to the byte, for 8 CPU-s more.
    for param in model.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    with tracker:
        step()
        held = _by_kind(tracker.get_tracker_snapshot("current"))
        at_peak = _by_kind(tracker.get_tracker_snapshot("peak"))
        optimizer.zero_grad(set_to_none=True)
    return Memory(
        held["parameters"],
        held["gradients"],
        held["optimizer"],
        at_peak,
        f"measured: torch FSDPMemTracker, fully_shard on {mesh.size()} fake ranks (fake tensors)",
    )
