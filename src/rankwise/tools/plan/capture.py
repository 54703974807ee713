"""The model, optimizer and micro-batch of a user's training step, captured without allocating the
model.

From a script (:func:`from_script`): the script runs in this process as ``__main__`` with its own
arguments, every parameter its modules register fake
(:class:`~rankwise.tools.plan.fake.FakeParameters`), until its first training forward: the call of
the model an optimizer trains, with gradients on.  That call's inputs are the micro-batch one rank
computes at world size 1 (a script that starts its own distributed job runs it as one rank, its DDP
or FSDP wrapper standing aside: :mod:`~rankwise.tools.plan.own_world`); the script stops there
(``CaptureDone``, a clean end: a ``rankwise.setup()`` Runtime closes as after its loop).  A script
on ``rankwise.setup()`` also tells, through the Runtime's observer points, its gradient accumulation
(``rt.prepare``) and its global batch (``rt.loader``); whether its forward runs under
``rt.autocast()`` is recorded too.  From a factory (:func:`from_factory`): the same, for a model
built in Python (tests, the library).

What the plan then replays is ``model(*args, **kwargs)`` and, as the loss, the output's ``loss``
where it has one (transformers' models given labels), else the sum of its first tensor: a loss the
script computes outside the model (a cross-entropy over logits) is not replayed, and costs a
gradient of the logits' size in both.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from rankwise.compat.deepspeed_zero import skip_shm_comm_build
from rankwise.compat.fake_tensor import ITEM, FakeTensorMode
from rankwise.errors import ConfigError
from rankwise.logs import get_logger
from rankwise.precision import Precision
from rankwise.runtime import observers
from rankwise.strategies.blocks import is_checkpointed
from rankwise.tools.plan.failure import called_at, not_run
from rankwise.tools.plan.fake import FakeParameters, fake_mode, is_fake
from rankwise.tools.plan.lightning_steps import TrainingStep, has_training_step
from rankwise.tools.plan.own_world import one_rank, unwrapped

if TYPE_CHECKING:
    from rankwise.runtime import Runtime

log = get_logger(__name__)

Captured = tuple[nn.Module, torch.optim.Optimizer, tuple[Any, ...], dict[str, Any], bool]
"""The first training forward as caught: the module called (the model, a DDP stand-in around it, or
a :class:`~rankwise.tools.plan.lightning_steps.TrainingStep`), the optimizer training it, its
positional and keyword inputs (the script's batch: whatever its loader yields), and whether it ran
under autocast."""


class CaptureDone(observers.Finished):
    """The script reached its first training forward: everything the plan needs is captured."""


@dataclass
class Capture:
    model: nn.Module
    """The model the script trains, its parameters fake, as it was at its first training forward."""
    optimizer: torch.optim.Optimizer
    """The optimizer over the model's parameters (still without state)."""
    args: tuple[Any, ...]
    """Positional inputs of the first training forward (real tensors: one rank's micro-batch at
    world size 1)."""
    kwargs: dict[str, Any]
    """Keyword inputs of that forward."""
    mode: FakeTensorMode
    """The mode the fake parameters belong to (every later fake tensor of the plan must share
    it)."""
    autocast: bool = False
    """Whether the forward ran under autocast (``rt.autocast()``, or the script's own
    ``torch.autocast``)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (``rt.prepare(..., grad_accum=)``; 1 for a script not on
    rankwise)."""
    global_batch: int | None = None
    """Samples per optimizer step over all ranks (``rt.loader``'s ``batch_size``), held fixed across
    world sizes as rankwise does; ``None`` for a plain script (its per-rank batch is then held fixed
    instead)."""
    source: str = ""
    """What was captured, for the report (``examples/causal_lm.py --length 64``)."""
    checkpointed: bool = field(default=False)
    """Whether the script itself checkpoints the model's layers (``rt.prepare(...,
    activation_checkpointing=True)``)."""
    on_rankwise: bool = False
    """Whether the script runs on ``rankwise.setup()`` (its ``rt.prepare`` was seen): the strategies
    ``rankwise launch`` chooses run it unchanged, so ``--validate`` can measure them."""
    line: int | None = None
    """The script's line that made the captured call (its ``model(...)``, its ``trainer.fit``):
    what a failure of the replay names where its traceback passes through no line of the script
    (:mod:`~rankwise.tools.plan.failure`)."""
    clips_at: int | None = None
    """The script's line that clips the gradients' norm (:mod:`~rankwise.tools.plan.clipping`), or
    ``None``: a sharded strategy's step then all-reduces no norm."""

    @property
    def rows(self) -> int:
        """Samples in the captured micro-batch (dimension 0 of its first tensor)."""
        for value in tensors([self.args, self.kwargs]):
            if value.ndim >= 1:
                return int(value.shape[0])
        raise ConfigError("the captured forward has no tensor input with a batch dimension")


def loss_of(output: object) -> torch.Tensor:
    """The loss the plan back-propagates from a forward's output (see the module's docstring)."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(output, torch.Tensor):
        return output.float().sum()
    values = (
        output.values()
        if isinstance(output, dict)
        else output
        if isinstance(output, (tuple, list))
        else []
    )
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.float().sum()
    raise ConfigError(
        f"cannot find a loss in the model's output ({type(output).__name__}): return a tensor, or "
        "an output with a .loss"
    )


def _root(params: list[torch.Tensor]) -> nn.Module | None:
    """The model an optimizer trains: of the modules no other module contains, the one holding most
    of ``params``."""
    # (type(): no __class__ lookups)
    modules = [obj for obj in gc.get_objects() if issubclass(type(obj), nn.Module)]
    inside = {id(child) for module in modules for child in module.children()}
    wanted = {id(p) for p in params}
    best, best_count = None, 0
    for module in modules:
        if id(module) in inside:
            continue
        count = sum(1 for p in module.parameters() if id(p) in wanted)
        if count > best_count:
            best, best_count = module, count
    return best


class _Watch(observers.Observer):
    """The Runtime's observer points during a capture: accumulation and global batch."""

    def __init__(self) -> None:
        self.grad_accum, self.prepared_seen = 1, False
        self.global_batch: int | None = None

    def prepared(self, rt: Runtime, model: nn.Module, grad_accum: int) -> None:
        self.grad_accum, self.prepared_seen = grad_accum, True

    def loader(self, rt: Runtime, global_batch: int, shuffle: bool) -> None:
        # the training loader (evaluation loaders do not shuffle)
        if shuffle and self.global_batch is None:
            self.global_batch = global_batch


class _Catcher:
    """Finds the model each new optimizer trains and records the first forward of one with gradients
    on."""

    def __init__(self, fakes: FakeParameters, script: Path | None = None) -> None:
        self.fakes = fakes
        self.script = script
        self.line: int | None = None
        self.captured: Captured | None = None
        self.autocast_called = False
        self.values_read = 0
        self.groups: dict[int, list[list[torch.Tensor]]] = {}

    @contextlib.contextmanager
    def watching(self) -> Iterator[_Catcher]:
        init, autocast, item = torch.optim.Optimizer.__init__, Precision.autocast, torch.Tensor.item
        catcher = self
        ITEM.check()

        def fake_item(tensor: torch.Tensor) -> bool | int | float:
            # (an evaluation before training reads a loss of fake parameters: the script goes on
            # with 0, which the plan never uses; compat.fake_tensor.ITEM)
            if is_fake(tensor):
                catcher.values_read += 1
                if tensor.dtype == torch.bool:
                    return False
                return 0.0 if tensor.dtype.is_floating_point else 0
            return item(tensor)

        def optimizer_init(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> None:
            init(optimizer, *args, **kwargs)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if params and all(is_fake(p) for p in params):
                catcher.groups[id(optimizer)] = [list(g["params"]) for g in optimizer.param_groups]
                model = _root(params)
                if model is not None and has_training_step(unwrapped(model)):
                    catcher.watch_training_step(unwrapped(model), optimizer)
                elif model is not None:
                    # (on the script's own model: a DeepSpeed engine's forward calls it)
                    unwrapped(model).register_forward_pre_hook(
                        catcher.hook(optimizer), with_kwargs=True
                    )

        def precision_autocast(precision: Precision) -> contextlib.AbstractContextManager[Any]:
            catcher.autocast_called = True
            return autocast(precision)

        # (patched for the capture only, restored after: mypy does not follow a monkeypatch)
        torch.optim.Optimizer.__init__ = optimizer_init  # type: ignore[method-assign,assignment]
        Precision.autocast = precision_autocast  # type: ignore[method-assign,assignment]
        torch.Tensor.item = fake_item  # type: ignore[method-assign,assignment]
        try:
            yield self
        finally:
            torch.optim.Optimizer.__init__ = init  # type: ignore[method-assign]
            Precision.autocast = autocast  # type: ignore[method-assign]
            torch.Tensor.item = item  # type: ignore[method-assign]

    def _autocast_on(self) -> bool:
        on = any(
            torch.is_autocast_enabled(kind) for kind in ("cpu", "cuda") if _autocast_known(kind)
        )
        return on or self.autocast_called

    def own_parameters(self, optimizer: torch.optim.Optimizer) -> None:
        """Give ``optimizer``'s groups back the model's parameters they were built over: DeepSpeed's
        ZeRO-1/2 hands the optimizer it wraps a flat partition of each group in their place
        (``stage_1_and_2.py``), which the plan's copy of the model does not have."""
        groups = self.groups.get(id(optimizer))
        if groups is not None and len(groups) == len(optimizer.param_groups):
            for group, params in zip(optimizer.param_groups, groups, strict=True):
                group["params"] = params

    def hook(
        self, optimizer: torch.optim.Optimizer
    ) -> Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], None]:
        def first_training_forward(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> None:
            # (the model inside a stand-in DDP wrapper says whether it trains: a framework may
            # switch the model alone to training mode)
            if self.captured is None and torch.is_grad_enabled() and unwrapped(module).training:
                self.captured = (module, optimizer, args, kwargs, self._autocast_on())
                self.line = called_at(self.script) if self.script else None
                raise CaptureDone()

        return first_training_forward

    def watch_training_step(self, model: Any, optimizer: torch.optim.Optimizer) -> None:
        """Capture the first ``model.training_step(...)`` with gradients on
        (:mod:`~rankwise.tools.plan.lightning_steps`): the call is watched on the instance, which
        Lightning's forward redirection and its plain call both look the method up on."""
        original = model.training_step

        def training_step(*args: Any, **kwargs: Any) -> Any:
            if self.captured is None and torch.is_grad_enabled() and model.training:
                del model.training_step  # (the class's own again)
                self.captured = (TrainingStep(model), optimizer, args, kwargs, self._autocast_on())
                self.line = called_at(self.script) if self.script else None
                raise CaptureDone()
            return original(*args, **kwargs)

        # (an instance attribute over the class's method, removed at the capture)
        model.training_step = training_step


def map_tensors(fn: Callable[[torch.Tensor], object], value: Any) -> Any:
    """``value`` with ``fn`` applied to every tensor in it, through tuples (named ones too), lists
    and mappings (a Lightning batch is a list of tensors; a tokenizer's a ``BatchEncoding``)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_tensors(fn, v) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(fn, v) for v in value)
    if isinstance(value, Mapping):
        items = {k: map_tensors(fn, v) for k, v in value.items()}
        try:
            return type(value)(items)  # type: ignore[call-arg]
        except TypeError:  # (a mapping whose constructor takes something else)
            return items
    return value


def tensors(value: object) -> list[torch.Tensor]:
    """Every tensor in ``value``, in order (see :func:`map_tensors`)."""
    found: list[torch.Tensor] = []
    map_tensors(found.append, value)
    return found


def on_cpu(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    autocast: bool,
) -> Captured:
    """The captured step on the CPU, whatever device the script moved it to (a GPU script's
    ``model.to("cuda")``, ``rt.prepare`` on a GPU machine): the plan replays it on fake tensors,
    whose device is a label, with the CPU's autocast and FSDP on a CPU mesh of fake ranks; the
    target device is ``--device``'s.  The parameters keep their objects (the optimizer's), moved
    in place (:class:`~rankwise.tools.plan.fake.FakeParameters` is active); the micro-batch is
    copied (one rank's, small)."""
    model.to("cpu")
    cpu = map_tensors(lambda t: t.to("cpu"), (tuple(args), dict(kwargs)))
    return model, optimizer, cpu[0], cpu[1], autocast


def _autocast_known(kind: str) -> bool:
    return kind == "cpu" or torch.cuda.is_available()


def from_script(
    script: Path, script_args: list[str], traceback_file: Path | None = None
) -> Capture:
    """Run ``script`` (as ``python script ARGS``) here up to its first training forward (see the
    module's docstring).  A script that fails before it is a :class:`~rankwise.errors.ScriptNotRun`
    naming its line (``traceback_file``: where its traceback goes)."""
    from rankwise.launch.script import run_as_main

    if not script.is_file():
        raise ConfigError(f"{script}: no such script")
    if "deepspeed" in script.read_text(encoding="utf-8", errors="replace"):
        # (before the script's deepspeed.init_distributed, as verify does: the CPU shared-memory
        # kernel it compiles, 1-2 minutes on a new virtualenv, serves inference alone)
        skip_shm_comm_build()
    mode = fake_mode()
    watch = _Watch()
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    observers.register(watch)
    try:
        with (
            one_rank(),
            FakeParameters(mode) as fakes,
            _Catcher(fakes, script).watching() as catcher,
        ):
            try:
                run_as_main(script, script_args)
            except CaptureDone:
                pass
            except SystemExit as e:
                if catcher.captured is None:
                    raise ConfigError(
                        f"{script} exited (status {e.code}) before its first training step"
                    ) from None
            except Exception as e:
                if catcher.captured is None:
                    raise not_run(
                        script,
                        e,
                        "run it up to its first training step with its model's parameters fake "
                        "(shapes only, no values)",
                        traceback_file=traceback_file,
                    ) from e
            if catcher.captured is not None:
                catcher.captured = on_cpu(*catcher.captured)
    finally:
        observers.unregister(watch)
        sys.argv[:], sys.path[:] = saved_argv, saved_path
    if catcher.captured is None:
        raise ConfigError(
            f"{script} ended without a training step: no model an optimizer trains ran forward "
            "with gradients on (build the optimizer before the training loop)"
        )
    if catcher.values_read:
        log.info(
            f"rankwise plan: {script} read {catcher.values_read} value(s) of its model's fake "
            "tensors before its first training step (.item(), an evaluation first): each read 0"
        )
    model, optimizer, args, kwargs, autocast = catcher.captured
    catcher.own_parameters(optimizer)
    model = unwrapped(model)
    if isinstance(model, TrainingStep):
        model.detach()
    # the script's frames are gone; whatever it built besides the capture goes with them
    gc.collect()
    source = " ".join([str(script), *script_args])
    return Capture(
        model,
        optimizer,
        tuple(args),
        dict(kwargs),
        mode,
        autocast,
        watch.grad_accum,
        watch.global_batch,
        source,
        checkpointed=is_checkpointed(model),
        on_rankwise=watch.prepared_seen,
        line=catcher.line,
    )


def from_factory(
    build: Callable[[], tuple[nn.Module, torch.optim.Optimizer]],
    batch: dict | tuple,
    *,
    grad_accum: int = 1,
    global_batch: int | None = None,
    autocast: bool = False,
    source: str = "",
) -> Capture:
    """A capture of ``build()``'s ``(model, optimizer)``, built with fake parameters, and ``batch``
    (a dict of keyword inputs, or a tuple of positional ones: one rank's micro-batch at world size
    1)."""
    mode = fake_mode()
    with FakeParameters(mode):
        model, optimizer = build()
    args, kwargs = (tuple(batch), {}) if isinstance(batch, tuple) else ((), dict(batch))
    return Capture(
        model,
        optimizer,
        args,
        kwargs,
        mode,
        autocast,
        grad_accum,
        global_batch,
        source or getattr(build, "__name__", "model"),
        is_checkpointed(model),
    )
