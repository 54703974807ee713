"""One rank's memory under a strategy at a world size, from the measured step
(:mod:`~rankwise.tools.plan.fake_step`).

The trace is one rank training alone: its parameters P, gradients G, optimizer state and, over the
step, the live activations and temporaries.  Each memory layout a strategy's file declares
(:attr:`rankwise.strategies.facts.Facts.layout`) says here which of these a rank holds at world size
N, what it allocates besides (buckets, flat copies, gathered parameters), and when; the peak is the
largest total over the step's samples.  Every formula names its source.  FSDP is not here: fake
tensors reach it, and :mod:`rankwise.tools.plan.fsdp_fake_ranks` measures it with torch's
``FSDPMemTracker`` on N fake ranks.

Notation: Φ trainable parameter elements, d bytes per parameter element in the strategy's model copy
(4 for fp32, 2 under DeepSpeed's bf16), m the optimizer's moments per element (Adam: 2), N ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from rankwise.errors import ConfigError
from rankwise.strategies import lookup
from rankwise.tools.plan.fake_step import Sample, Trace
from rankwise.tools.plan.zero3_fetch import gathers

KINDS = ("parameters", "gradients", "optimizer", "activations", "buffers")
"""What a rank's memory is made of, in the order the report stacks them."""


@dataclass
class Memory:
    """One rank's memory, in bytes."""

    parameters: int
    """Parameters the rank keeps (its shard, or all of them), in the strategy's own copy."""
    gradients: int
    """Gradients the rank keeps once its backward pass is done (its shard, or all of them)."""
    optimizer: int
    """Optimizer state the rank keeps: moments, and fp32 master weights where the strategy has
    them."""
    at_peak: dict[str, int]
    """Every kind of :data:`KINDS` at the step's peak; they sum to :attr:`peak`.  Activations
    include the temporaries, the batch and module buffers; buffers are the strategy's communication
    buffers and gathered parameters."""
    source: str
    """How the numbers were obtained (a formula and its source, or a measurement)."""
    notes: list[str] = field(default_factory=list)
    """Caveats for this row."""

    @property
    def peak(self) -> int:
        return sum(self.at_peak.values())

    @property
    def activations(self) -> int:
        return self.at_peak["activations"]

    @property
    def buffers(self) -> int:
        return self.at_peak["buffers"]


Step = Callable[[Sample], dict[str, int]]


def peak_over(trace: Trace, held: dict[str, int], during: Step) -> dict[str, int]:
    """The kinds at the sample where ``held`` (constant through the step) plus ``during(sample)`` is
    largest."""
    best, parts = -1, dict[str, int]()  # the loop runs at least once, and any total beats -1
    for sample in trace.samples or [Sample(0, 0, 0, 0)]:
        now = during(sample)
        total = sum(now.values())
        if total > best:
            best, parts = total, now
    return {kind: held.get(kind, 0) + parts.get(kind, 0) for kind in KINDS}


def fixed_activations(trace: Trace) -> int:
    """What every strategy holds besides the step's allocations: the batch and the module
    buffers."""
    return trace.input_bytes + trace.buffer_bytes


def grads_during(trace: Trace, sample: Sample, accumulating: bool) -> int:
    """Gradients alive at ``sample`` in a strategy that keeps them whole: as computed, or (a step of
    several micro-batches) all of them from the first micro-batch's backward on."""
    return trace.gradient_bytes if accumulating and sample.phase < 2 else sample.gradients


@dataclass(frozen=True)
class Setting:
    """What the formulas need besides the trace."""

    world_size: int
    """Ranks in the job."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    ddp_bucket_view: bool = True
    """DDP's ``gradient_as_bucket_view`` (rankwise's default: true)."""
    zero_bucket: int = 5_000_000
    """DeepSpeed's ``reduce_bucket_size`` (elements; rankwise's ``deepspeed.bucket_size``)."""
    zero_max_live: int = 10_000_000
    """DeepSpeed's ``stage3_max_live_parameters`` (rankwise's ``deepspeed.max_live_parameters``)."""
    zero_persistence: int = 100_000
    """DeepSpeed's ``stage3_param_persistence_threshold``: parameters smaller than this stay whole
    on every rank."""
    horovod_fusion_bytes: int = 128 * 2**20
    """Horovod's fusion buffer (``HOROVOD_FUSION_THRESHOLD``, 128 MiB by default)."""
    gloo: bool = False
    """The ranks communicate over gloo (a plan for this machine's CPU), whose collectives copy more
    than NCCL's (:func:`reduce_copies`)."""


def single(trace: Trace, setting: Setting) -> Memory:
    """One process: the trace itself."""
    accumulating = setting.grad_accum > 1
    at = peak_over(
        trace,
        {
            "parameters": trace.param_bytes,
            "optimizer": trace.optimizer_bytes,
            "activations": fixed_activations(trace),
        },
        lambda s: {
            "gradients": grads_during(trace, s, accumulating),
            "activations": s.activations + s.optimizer_temporaries,
        },
    )
    return Memory(
        trace.param_bytes, trace.gradient_bytes, trace.optimizer_bytes, at, "measured (one process)"
    )


def ddp(trace: Trace, setting: Setting) -> Memory:
    """``DistributedDataParallel``: every rank holds the whole model, its gradients and optimizer
    state.

    Source: torch ``csrc/distributed/c10d/reducer.cpp`` (``Reducer::initialize_buckets``): one flat
    tensor per bucket, the buckets together covering every parameter's gradient, allocated when the
    model is wrapped and kept. With ``gradient_as_bucket_view`` (rankwise's default) each ``.grad``
    is a view into its bucket, so the gradients are the buckets: G bytes held from the start.
    Without it the gradients are separate tensors copied into the buckets: G more, as buffers.
    Under ``no_sync`` (a step of several micro-batches) the reducer's hooks stand aside and autograd
    accumulates the gradients in tensors of its own; the step's last backward copies them into the
    buckets, so until then both exist: G more from the first micro-batch's backward on.  The
    all-reduce works in place on the buckets."""
    accumulating = setting.grad_accum > 1
    held = {
        "parameters": trace.param_bytes,
        "optimizer": trace.optimizer_bytes,
        "activations": fixed_activations(trace),
    }
    if setting.ddp_bucket_view:
        held["gradients"] = trace.gradient_bytes

        def during(s: Sample) -> dict[str, int]:
            outside = grads_during(trace, s, accumulating) if accumulating and s.phase < 2 else 0
            return {"activations": s.activations + s.optimizer_temporaries, "gradients": outside}
    else:
        held["buffers"] = trace.gradient_bytes

        def during(s: Sample) -> dict[str, int]:
            return {
                "gradients": grads_during(trace, s, accumulating),
                "activations": s.activations + s.optimizer_temporaries,
            }

    source = (
        "formula: parameters + optimizer state + gradient buckets (torch reducer.cpp; gradients "
        "are views of the buckets) + the traced activations"
        if setting.ddp_bucket_view
        else "formula: parameters + optimizer state + gradient buckets (torch reducer.cpp) + the "
        "traced gradients and activations"
    )
    if accumulating:
        source += "; no_sync's gradients beside the buckets until the step's last backward"
    return Memory(
        trace.param_bytes,
        trace.gradient_bytes,
        trace.optimizer_bytes,
        peak_over(trace, held, during),
        source,
    )


def horovod(trace: Trace, setting: Setting) -> Memory:
    """Horovod's ``DistributedOptimizer``: whole model, gradients and state on every rank; gradients
    are all-reduced through a fusion buffer (``HOROVOD_FUSION_THRESHOLD``, 128 MiB) that Horovod
    allocates itself, outside torch (source: horovod/common/fusion_buffer_manager.cc)."""
    memory = single(trace, setting)
    memory.at_peak["buffers"] += setting.horovod_fusion_bytes
    memory.source = (
        "formula: one process's memory + Horovod's fusion buffer (fusion_buffer_manager.cc)"
    )
    return memory


def zero_partition(numel: int, world: int) -> int:
    """Elements of one rank's partition of ZeRO-1/2's flat buffer: the buffer is padded to a
    multiple of 2N (``nccl_start_alignment_factor`` x N, stage_1_and_2.py) and split evenly."""
    alignment = 2 * world
    return math.ceil(numel / alignment) * alignment // world


def zero12(stage: int) -> Callable[[Trace, Setting], Memory]:
    """DeepSpeed ZeRO stage 1 or 2 (``deepspeed/runtime/zero/stage_1_and_2.py``, DeepSpeed 0.19).

    - Parameters: the model's parameters become views of one flat buffer, ``bit16_groups_flat``,
      padded to 2N elements: d x Φ on every rank.
    - Optimizer state: the rank's partition φ = Φ/N of fp32 master weights
      (``single_partition_of_fp32_groups``, a copy even when the model is fp32) and the optimizer's
      moments over it: (4 + 4m) x φ (ZeRO paper, Rajbhandari et al. 2020, section 5: K = 12 for
      mixed-precision Adam).
    - Gradients: stage 1 keeps whole gradients through the backward pass (d x Φ); stage 2 copies
      each reduced gradient into its partition, ``grads_in_partition`` (d x φ).  At the optimizer
      step the partition's gradient is also copied to fp32 (4 x φ, a temporary).
    - Buffers: during the backward pass, the reduction bucket of ``reduce_bucket_size`` elements at
      d bytes (one: ``overlap_comm`` is false below stage 3, so ``setup_buckets`` allocates no
      second buffer; each micro-batch's replaces the last's).
    - Activations: the trace's; the optimizer's temporaries scale with the partition."""

    def memory(trace: Trace, setting: Setting) -> Memory:
        n, phi, d = setting.world_size, trace.numel, trace.itemsize
        part = zero_partition(phi, n)
        flat = part * n
        optimizer = (4 + 4 * trace.optimizer_moments) * part
        gradients = d * flat if stage == 1 else d * part
        held = {
            "parameters": d * flat,
            "optimizer": round(optimizer),
            "activations": fixed_activations(trace),
        }
        bucket = d * setting.zero_bucket

        def during(s: Sample) -> dict[str, int]:
            if s.phase == 0:
                return {
                    "activations": s.activations,
                    "gradients": grads_during(trace, s, setting.grad_accum > 1)
                    if stage == 1
                    else 0,
                }
            if s.phase == 1:
                return {
                    "activations": s.activations,
                    "buffers": bucket,
                    "gradients": s.gradients if stage == 1 else gradients,
                }
            return {
                "activations": s.activations + round(s.optimizer_temporaries * part / max(phi, 1)),
                "gradients": (gradients if stage == 2 else d * part) + 4 * part,
            }

        return Memory(
            d * flat,
            gradients,
            round(optimizer),
            peak_over(trace, held, during),
            f"formula: DeepSpeed ZeRO-{stage} (stage_1_and_2.py: flat d x Φ parameters, fp32 "
            f"master and moments on Φ/N, {'whole' if stage == 1 else 'partitioned'} gradients, a "
            f"reduce bucket of {setting.zero_bucket:,} elements)",
        )

    return memory


def sub_groups(numels: list[int], world: int, size: int) -> list[int]:
    """Elements of each ZeRO-3 optimizer sub-group (``stage3.py``, ``_create_fp16_sub_groups``:
    the rank's partitions in parameter order, a sub-group closed once it holds ``size`` elements,
    so up to one partition more; rankwise sets ``sub_group_size`` to its bucket size)."""
    groups: list[int] = []
    filled = 0
    for numel in numels:
        filled += math.ceil(numel / world)
        if filled >= size:
            groups.append(filled)
            filled = 0
    return [*groups, filled] if filled else groups


def reduce_buckets(numels: list[int], bucket: int) -> list[list[int]]:
    """ZeRO-3's gradient reductions in one backward pass, each the elements of the gradients it
    reduces: the gradients in the order the backward pass computes them (the parameters' reverse
    order), a bucket reduced before a gradient that would overflow it joins
    (``stage3.py``, ``reduce_independent_p_g_buckets_and_remove_grads``), the last one by the
    backward's epilogue (``independent_gradient_partition_epilogue``)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for numel in reversed(numels):
        if current and filled + numel > bucket:
            buckets.append(current)
            current, filled = [], 0
        current.append(numel)
        filled += numel
    return [*buckets, current] if current else buckets


def reduce_copies(gradients: list[int], world: int, itemsize: int, gloo: bool) -> int:
    """Bytes one ZeRO-3 reduction allocates besides its bucket (``gradients``: their elements).

    - Every backend: ``reduce_scatter_coalesced`` (``runtime/comm/coalesced_collectives.py``,
      called by ``stage3.py``'s ``__avg_scatter_grads``: ``reduce_scatter`` is true by default)
      interleaves the gradients' rank slices, each padded to ceil(n/N), into one flat copy
      (``torch.cat``), except a lone gradient of a multiple of N elements, reduced in place.
    - gloo only: torch's reduce-scatter on gloo (``distributed_c10d.reduce_scatter_single``)
      reduces a copy of its whole input, freed when it returns (measured, 2 ranks); NCCL reduces
      the input itself."""
    padded = sum(math.ceil(numel / world) * world for numel in gradients)
    lone = len(gradients) == 1 and gradients[0] % world == 0
    return itemsize * ((0 if lone else padded) + (padded if gloo else 0))


def zero3_step(trace: Trace, setting: Setting) -> tuple[dict[str, int], Step]:
    """What :func:`zero3` holds through the step, and what it adds at each of the trace's
    samples."""
    n, d = setting.world_size, trace.itemsize
    partitioned = [numel for numel in trace.numels if numel >= setting.zero_persistence]
    persistent = sum(numel for numel in trace.numels if numel < setting.zero_persistence)
    part = sum(math.ceil(numel / n) for numel in trace.numels)
    masters = 0 if trace.param_dtype == "float32" else 4 * part
    held = {
        "parameters": d * (part + persistent),
        "gradients": d * part,
        "optimizer": masters + round(4 * trace.optimizer_moments * part),
        "activations": fixed_activations(trace),
        "buffers": d * setting.zero_bucket,
    }
    sub = max(sub_groups(trace.numels, n, setting.zero_bucket), default=0)
    # the last backward sample: the epilogue's reduction follows it
    last = next((s for s in reversed(trace.samples) if s.phase == 1), None)
    gathered = {"forward": 0, "backward": 0}
    flat = {"forward": 0, "backward": 0}
    whole_gradient, copies, epilogue = 0, [0], dict[str, int]()
    if n > 1 and partitioned:
        passes = gathers(
            trace,
            persistence=setting.zero_persistence,
            bucket=setting.zero_bucket,
            max_live=setting.zero_max_live,
        )
        # the most gathered at once in each pass, as the coordinator's replay has it (without a
        # recorded module order: the live parameters, or the largest one)
        bound = min(sum(partitioned), max(setting.zero_max_live, max(partitioned)))
        live = {name: g.live or bound for name, g in passes.items()}
        gathered = {name: d * elements for name, elements in live.items()}
        # (gloo's and NCCL's alike: the call's flat buffer beside each parameter's own copy)
        flat = {name: d * g.largest for name, g in passes.items()}
        # what stays gathered at the epilogue: the modules whose post-backward hook never fired
        # (fed the batch, which needs no gradient: released later, release_backward_leftovers),
        # the first module to own partitioned parameters; every other one was released after its
        # backward (release_sub_module)
        owners = (
            [trace.numels[p] for p in params if trace.numels[p] >= setting.zero_persistence]
            for params in trace.module_params
        )
        first = next((sum(own) for own in owners if own), live["backward"])
        epilogue["buffers"] = d * min(first, live["backward"])
    if n > 1 and trace.numels:
        # a parameter's gradient is computed whole (the trace's activations hold it at that
        # sample), then its hook copies it into the bucket (contiguous_gradients) and frees it; one
        # larger than the bucket stays whole until the next hook reduces it alone, past the
        # samples the trace shows it in: the largest such one, beside its gathered parameter
        # (DeepSpeed's own estimator: 4 x the largest layer's parameters, 2 bytes each of
        # parameter and gradient)
        largest = max(trace.numels)
        whole_gradient = d * largest if largest > setting.zero_bucket else 0
        buckets = reduce_buckets(trace.numels, setting.zero_bucket)
        copies = [reduce_copies(b, n, d, setting.gloo) for b in buckets]
        final = buckets[-1]
        alone = d * final[0] if len(final) == 1 and final[0] > setting.zero_bucket else 0
        epilogue["buffers"] = epilogue.get("buffers", 0) + copies[-1] + alone
    # (a reduction before the last: within a gradient's hook, mid-pass)
    mid = max(copies[:-1], default=0)

    def during(s: Sample) -> dict[str, int]:
        if s.phase == 0:
            return {"activations": s.activations, "buffers": gathered["forward"] + flat["forward"]}
        if s.phase == 1:
            step = gathered["backward"] + flat["backward"] + whole_gradient + mid
            now = {"activations": s.activations, "buffers": step}
            # the epilogue runs once autograd's graph is done (queue_post_backward_callback): the
            # pass's own tensors are freed by then
            if s is last and sum(epilogue.values()) > sum(now.values()):
                return epilogue
            return now
        return {
            "activations": s.activations
            + round(s.optimizer_temporaries * sub / max(trace.numel, 1)),
            # the sub-group's gradient flattened to fp32 (_prepare_fp32_grad_for_sub_group),
            # dropped after its step (_release_sub_group)
            "buffers": 4 * sub,
        }

    return held, during


def zero3(trace: Trace, setting: Setting) -> Memory:
    """DeepSpeed ZeRO stage 3 (``deepspeed/runtime/zero/stage3.py``, ``partition_parameters.py``
    and ``partitioned_param_coordinator.py``, DeepSpeed 0.19).

    - Parameters: each parameter is partitioned on its own, ceil(n/N) elements a rank
      (``ds_tensor``), at d bytes; parameters smaller than ``stage3_param_persistence_threshold``
      also stay whole on every rank.
    - Gradients: one flat buffer of the partitions, ``grad_partitions_flat_buffer``: d x φ, kept.
    - Optimizer state: fp32 master partitions (none in fp32: rankwise aliases them,
      ``compat.deepspeed_zero``) and the moments: (4 [bf16] + 4m) x φ.
    - Buffers, kept: the reduction bucket (``reduce_bucket_size`` elements at d bytes,
      ``ipg_buckets``; ``contiguous_gradients`` copies each whole gradient into it as it is
      computed, so the gradients waiting for the bucket to fill are in it).  The fp32 gradient
      buffer ``initialize_optimizer_states`` makes is replaced at the first step, so not kept.
    - Forward pass: the gathered parameters of the layers in use, at most
      ``stage3_max_live_parameters`` elements (and at least the largest partitioned parameter), d
      bytes each; and the flat buffer of the largest gather of several parameters
      (``_all_gather_dtype``: each parameter is then copied out of it, ``AllGatherCoalescedHandle``,
      and the buffer lives until the last of them is fetched; replayed by
      :func:`~rankwise.tools.plan.zero3_fetch.gathers`).  Every backend.
    - Backward pass: the gathered parameters (and a flat buffer where they are gathered again),
      the largest gradient when it is larger than the bucket (whole until the next gradient's hook
      reduces it alone; DeepSpeed's ``estimate_zero3_model_states_mem_needs`` charges 4 bytes of
      the largest layer's parameters, its 16-bit parameter and gradient), and a reduction's copies
      (:func:`reduce_copies`: the interleaved flat copy on every backend, a second copy on gloo).
      The last bucket is reduced after the pass (:func:`reduce_buckets`), beside the parameters
      still gathered then.  Measured against a real step on gloo at 2 ranks (``gloo``: a plan for
      the CPU), each phase within 0.1 % on the accounting model, a reduction within the pass
      counted beside every gathered parameter (an upper bound: +13 % on the backward pass of one
      case, tests/tools/plan/test_zero3_memory.py and docs/how-to/plan.md).
    - Optimizer step: one sub-group's gradient in fp32 (``sub_group_size`` elements, rankwise's
      bucket size) and the optimizer's temporaries scaled to the sub-group it steps.
    - Activations: the trace's."""
    held, during = zero3_step(trace, setting)
    return Memory(
        held["parameters"],
        held["gradients"],
        held["optimizer"],
        peak_over(trace, held, during),
        "formula: DeepSpeed ZeRO-3 (stage3.py: per-parameter partitions of Φ/N, fp32 master and "
        f"moments on them, a kept reduce bucket of {setting.zero_bucket:,} elements, gathered "
        f"layers up to {setting.zero_max_live:,} elements, the gathers' flat buffers and the "
        f"reductions' copies{' (gloo: one more each)' if setting.gloo else ''})",
    )


def formula(strategy: str) -> Callable[[Trace, Setting], Memory] | None:
    """The formula of the memory layout ``strategy``'s file declares
    (:attr:`rankwise.strategies.facts.Facts.layout`); ``None`` for a layout measured on fake ranks
    (FSDP2: :mod:`rankwise.tools.plan.fsdp_fake_ranks`)."""
    facts = lookup(strategy).facts
    if facts is None or facts.layout is None:
        raise ConfigError(f"rankwise plan knows no memory model for strategy {strategy!r}")
    if facts.layout == "flat-partitions":
        return zero12(2 if "gradients" in facts.shards else 1)
    return {
        "whole": single,
        "reducer-buckets": ddp,
        "fusion-buffer": horovod,
        "parameter-partitions": zero3,
        "measured": None,
    }[facts.layout]
