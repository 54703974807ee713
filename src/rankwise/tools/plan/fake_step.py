"""One rank's training step at world size 1, replayed on fake tensors and measured: memory over
time, by kind.

The captured model (:mod:`rankwise.tools.plan.capture`) is copied (its parameters fake, optionally
cast to 16 bits, its layers optionally checkpointed), given a fresh optimizer of the script's class
and settings, and stepped twice on the captured micro-batch resized to the rows asked for: the first
step creates the optimizer's state, the second is the steady step that is measured.  A dispatch mode
(:class:`StepTracker`) sees every operation of that step and every tensor storage it creates, and
follows each storage until it is freed (a weak reference, as torch's own ``MemTracker`` does): live
bytes after every allocation, split into activations (everything the forward and backward passes
create that is not a gradient: saved activations, their gradients, temporaries), gradients (a
parameter's ``.grad``, from its post-accumulate hook) and the optimizer step's temporaries.
Parameters, buffers, the batch and the optimizer's state exist before the step and are counted once.
``torch.utils.flop_counter.FlopCounterMode`` counts the forward and backward passes' FLOPs in the
same replay (activation checkpointing's recompute included).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from rankwise.compat.flop_formulas import total_counter
from rankwise.compat.torch_dispatch import TorchDispatchMode, tree_flatten
from rankwise.strategies.blocks import checkpoint_blocks, is_checkpointed, transformer_blocks
from rankwise.tools.plan.capture import Capture, loss_of, map_tensors, tensors
from rankwise.tools.plan.fake import fake_copy

PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class Sample:
    """Live bytes right after an allocation of the measured step (the peaks are right after
    allocations)."""

    phase: int
    """Index in :data:`PHASES`."""
    activations: int
    """Bytes of what the forward and backward passes created that is not a gradient."""
    gradients: int
    """Bytes of the parameters' gradients."""
    optimizer_temporaries: int
    """Bytes the optimizer step created that are not its state."""


@dataclass
class Trace:
    """The measured step: what one rank holds when it trains alone, and how it changes during the
    step."""

    rows: int
    """Samples in the micro-batch the step ran."""
    param_dtype: str
    """The parameters' dtype during the step (``float32``, or ``bfloat16`` for a 16-bit engine's
    copy)."""
    autocast: str | None
    """The dtype the forward ran under autocast, else ``None``."""
    checkpointed: bool
    """Whether the layers recomputed their activations in the backward pass."""
    numels: list[int]
    """Elements of each trainable parameter (tied parameters once)."""
    param_bytes: int
    """Bytes of all parameters (tied ones once), trainable or not."""
    buffer_bytes: int
    """Bytes of the module buffers."""
    input_bytes: int
    """Bytes of the micro-batch."""
    gradient_bytes: int
    """Bytes of the gradients after the backward pass."""
    optimizer_bytes: int
    """Bytes of the optimizer's state after a step (what it keeps between steps)."""
    optimizer_moments: float
    """The optimizer's state per parameter element, in parameters' worth (Adam's two moments: 2;
    SGD's momentum: 1); its scalars (a step count per parameter) left out."""
    flops: int
    """FLOPs of the micro-batch's forward and backward passes."""
    forward_flops: int
    """Of which the forward pass's."""
    samples: list[Sample] = field(default_factory=list)
    """Live bytes by kind during the steady step."""
    block_param_numels: list[int] = field(default_factory=list)
    """Elements of each transformer layer's parameters (FSDP's and ZeRO-3's units), in model
    order."""
    param_groups: int = 1
    """The optimizer's parameter groups that hold parameters (ZeRO-1/2 flatten each into one
    buffer, all-gathered in one call)."""
    module_params: list[tuple[int, ...]] = field(default_factory=list)
    """Each module call of the forward pass, in the order it started: the indices (into
    :attr:`numels`) of the trainable parameters the module holds itself (ZeRO-3 gathers a module's
    own parameters when it is called)."""
    module_events: list[int] = field(default_factory=list)
    """The forward's module calls starting (``i + 1``) and ending (``-(i + 1)``), in order: the
    order ZeRO-3's hooks fetch and release parameters in
    (:mod:`~rankwise.tools.plan.zero3_fetch`)."""

    @property
    def numel(self) -> int:
        """Trainable parameters."""
        return sum(self.numels)

    @property
    def itemsize(self) -> int:
        """Bytes per parameter element."""
        return torch.empty(0, dtype=getattr(torch, self.param_dtype)).element_size()

    def peak(
        self, *, gradients_held: bool = False, accumulating: bool = False
    ) -> tuple[int, Sample]:
        """The step's peak of activations + gradients + optimizer temporaries, and the sample it is
        at. ``gradients_held``: gradients live outside the step's allocations (DDP's buckets), so
        they are left out; ``accumulating``: a step of several micro-batches holds the whole
        gradient from the first one's backward on."""
        best, at = -1, None
        for sample in self.samples:
            grads = (
                0
                if gradients_held
                else self.gradient_bytes
                if accumulating and sample.phase < 2
                else sample.gradients
            )
            total = sample.activations + grads + sample.optimizer_temporaries
            if total > best:
                best, at = total, sample
        return max(best, 0), at or Sample(0, 0, 0, 0)


def _nbytes(storage: torch.UntypedStorage) -> int:
    return storage.nbytes()


class StepTracker(TorchDispatchMode):
    """Follows every tensor storage the operations inside it create (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.storages = WeakIdKeyDictionary()
        self.live = {"activations": 0, "gradients": 0, "optimizer_temporaries": 0}
        self.phase = 0
        self.samples: list[Sample] = []

    def known(self, tensors: Iterable[torch.Tensor]) -> None:
        """Storages that exist before the step (parameters, state, batch): never counted as
        created."""
        for tensor in tensors:
            self.storages[tensor.untyped_storage()] = (None, None)

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: object,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        grew = False
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor):
                grew |= self._created(
                    value.untyped_storage(),
                    "optimizer_temporaries" if self.phase == 2 else "activations",
                )
        if grew:
            self.samples.append(Sample(self.phase, *self.live.values()))
        return out

    def _created(self, storage: torch.UntypedStorage, kind: str) -> bool:
        if storage in self.storages:
            return False
        record: list = [kind, _nbytes(storage)]  # [kind, bytes]: a list the freeing callback reads
        self.storages[storage] = (record, weakref.ref(storage, partial(self._freed, record)))
        self.live[kind] += record[1]
        return record[1] > 0

    def _freed(self, record: list[Any], _ref: object) -> None:
        self.live[record[0]] -= record[1]

    def gradient(self, param: torch.Tensor) -> None:
        """A parameter's gradient is complete: its storage counts as a gradient from here on."""
        assert param.grad is not None  # called from its post-accumulate-grad hook
        storage = param.grad.untyped_storage()
        entry = self.storages.get(storage)
        if entry is None:
            self._created(storage, "gradients")
        elif entry[0] is not None and entry[0][0] != "gradients":
            record = entry[0]
            self.live[record[0]] -= record[1]
            record[0] = "gradients"
            self.live["gradients"] += record[1]


class ModuleOrder:
    """Records the forward's module calls as :attr:`Trace.module_params` and
    :attr:`Trace.module_events` (hooks that touch no tensor: the trace is the same)."""

    def __init__(self, model: torch.nn.Module, trainable: list[torch.Tensor]):
        self.index = {id(p): i for i, p in enumerate(trainable)}
        self.params: list[tuple[int, ...]] = []
        self.events: list[int] = []
        self.open: list[int] = []
        self.recording = False
        self.handles = [
            hook
            for module in model.modules()
            for hook in (
                module.register_forward_pre_hook(self.start),
                module.register_forward_hook(self.end, always_call=True),
            )
        ]

    def start(self, module: torch.nn.Module, _args: object) -> None:
        if self.recording:
            own = module.parameters(recurse=False)
            self.open.append(len(self.params))
            self.params.append(tuple(self.index[id(p)] for p in own if id(p) in self.index))
            self.events.append(len(self.params))

    def end(self, _module: torch.nn.Module, _args: object, _output: object) -> None:
        if self.recording and self.open:
            self.events.append(-(self.open.pop() + 1))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def resized(capture: Capture, rows: int) -> tuple[tuple, dict]:
    """The captured inputs with ``rows`` samples (the captured ones repeated in order)."""
    have = capture.rows
    index = torch.arange(rows) % have

    def resize(value: torch.Tensor) -> torch.Tensor:
        if value.ndim >= 1 and value.shape[0] == have:
            return value.index_select(0, index.to(value.device))
        return value

    return map_tensors(resize, capture.args), map_tensors(resize, capture.kwargs)


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen, out = set(), []
    for tensor in tensors:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            out.append(tensor)
    return out


def _storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    storages = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[id(storage)] = storage.nbytes()
    return sum(storages.values())


def _moments(optimizer: torch.optim.Optimizer, params: list[torch.Tensor]) -> float:
    elementwise = sum(
        value.numel()
        for p in params
        for value in optimizer.state.get(p, {}).values()
        if isinstance(value, torch.Tensor) and value.numel() == p.numel() and p.numel() > 1
    )
    total = sum(p.numel() for p in params)
    return elementwise / total if total else 0.0


def trace(
    capture: Capture,
    rows: int,
    *,
    param_dtype: torch.dtype | None = None,
    autocast: torch.dtype | None = None,
    checkpointing: bool = False,
) -> Trace:
    """Replay and measure the captured step with ``rows`` samples (see the module's docstring).
    ``param_dtype``: the parameters cast to it (a 16-bit engine's model); ``autocast``: the forward
    under autocast at that dtype (only where the script's own forward ran under ``rt.autocast()``);
    ``checkpointing``: layers recompute activations."""
    model, optimizer = fake_copy(capture.model, capture.optimizer, dtype=param_dtype)
    if checkpointing and not is_checkpointed(model):
        checkpoint_blocks(model)
    model.train()
    args, kwargs = resized(capture, rows)
    use_autocast = autocast is not None and capture.autocast

    def forward() -> torch.Tensor:
        with torch.autocast("cpu", dtype=autocast or torch.bfloat16, enabled=use_autocast):
            return loss_of(model(*args, **kwargs))

    # The first step, unmeasured: the forward makes what a model makes once (lazy parameters,
    # cached tables), and a step on zero gradients makes the optimizer's state; no backward pass,
    # the most costly part of a replay, is needed for either.
    with torch.no_grad():
        forward()
    for param in model.parameters():
        if param.requires_grad:
            param.grad = torch.zeros_like(param)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    params = _unique(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    inputs = tensors([args, kwargs])
    tracker = StepTracker()
    tracker.known([*params, *model.buffers(), *state, *inputs])
    hooks = [p.register_post_accumulate_grad_hook(tracker.gradient) for p in trainable]
    # (the forward's module calls only: a checkpointed layer's recompute calls them again)
    order = ModuleOrder(model, trainable)
    # (attention on the CPU's fake tensors is its fused kernel, which torch counts as 0 FLOPs:
    # counted as torch counts the GPU's; and no module breakdown, whose hooks kept checkpointed
    # layers' recomputed outputs alive: compat.flop_formulas)
    counter = total_counter()
    try:
        with tracker:
            with counter:
                order.recording = True
                loss = forward()
                order.recording = False
                forward_flops = int(counter.get_total_flops())
                tracker.phase = 1
                loss.backward()
            del loss
            tracker.phase = 2
            gradient_bytes = _storage_bytes(p.grad for p in trainable if p.grad is not None)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    finally:
        for hook in hooks:
            hook.remove()
        order.remove()
    blocks = transformer_blocks(model)
    return Trace(
        rows=rows,
        param_dtype=str(params[0].dtype).removeprefix("torch.") if params else "float32",
        autocast=str(autocast).removeprefix("torch.") if use_autocast else None,
        checkpointed=is_checkpointed(model),
        numels=[p.numel() for p in trainable],
        param_bytes=_storage_bytes(params),
        buffer_bytes=_storage_bytes(model.buffers()),
        input_bytes=_storage_bytes(inputs),
        gradient_bytes=gradient_bytes,
        optimizer_bytes=_storage_bytes(state),
        optimizer_moments=_moments(optimizer, trainable),
        flops=int(counter.get_total_flops()),
        forward_flops=forward_flops,
        samples=tracker.samples,
        block_param_numels=[sum(p.numel() for p in block.parameters()) for block in blocks],
        param_groups=max(1, sum(1 for group in optimizer.param_groups if group["params"])),
        module_params=order.params,
        module_events=order.events,
    )
