"""The step-by-step trace ``rankwise verify`` compares, as the watcher (:mod:`rankwise.tools.watch`)
writes it.

For every optimizer step each rank keeps a :class:`StepRecord`:

* one digest per sample of every batch the step trained on (evaluation is left out); padding is not
  part of a sample, so a sample padded to another batch's length keeps its digest;
* the tokens of each micro-batch, where the batch says it (``labels`` with -100,
  ``attention_mask``);
* every loss value given to backward;
* how many micro-batches drew random numbers in their forward (the generator moved);
* in a one-process run, the trainable parameters that got no gradient;

and rank 0 writes the full fp32 weights after the step (``step-00000`` as built) and the gradients
the step applied, whole, as the ranks exchanged them (``grad-00001``: what every rank's optimizer
received). Dropout modules are switched off (p=0) unless asked to keep them; the trace's facts say
which.

A one-process run following a traced N-rank run does so in lockstep: it starts each step from the
N-rank run's weights after the step before, computes its own gradient there and compares it with the
N-rank gradient (:func:`rankwise.measure.tolerance.gradient_difference`), then steps its own
optimizer with the N-rank gradient.  So what each step's comparison shows is that one step's
difference, never rounding compounded over the steps before it, and the weights after the step tell
whether the N-rank optimizer applied the same gradient as one process would.  In its first step the
one-process run also records which random operations its forward ran, and in which module
(:class:`RandomOps`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from rankwise.checkpoint import read_weights, write_weights
from rankwise.tools.watch.records import DropoutModule

TRACE_FILE, FACTS_FILE = "trace.jsonl", "trace-facts.json"


def _batch_dependent(module: nn.Module) -> bool:
    """BatchNorm normalises over the batch; InstanceNorm only keeps running statistics over it (when
    it tracks them)."""
    if isinstance(module, nn.SyncBatchNorm):
        return False
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return True
    return isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats


def model_facts(model: nn.Module) -> dict[str, list[str]]:
    """What a model holds that can make N ranks compute something else than one process."""
    batch_dependent = sorted({type(m).__name__ for m in model.modules() if _batch_dependent(m)})
    dropout = sorted(
        {
            type(m).__name__
            for m in model.modules()
            if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0
        }
    )
    return {"batch_dependent": batch_dependent, "dropout": dropout}


def uses_tf32(model: nn.Module, device: torch.device) -> bool:
    """Whether fp32 products of this model run on TF32 units: on CUDA, matrix products where torch
    allows it (off by default), convolutions where cuDNN does (on by default)."""
    if device.type != "cuda":
        return False
    convolutions = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    return torch.backends.cuda.matmul.allow_tf32 or (
        convolutions and torch.backends.cudnn.allow_tf32
    )


def weights_file(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:05d}.safetensors"


def gradients_file(directory: Path, step: int) -> Path:
    return Path(directory) / f"grad-{step:05d}.safetensors"


def switch_off_dropout(model: nn.Module, keep: bool) -> list[DropoutModule]:
    """Every dropout module with p > 0 (set to 0 unless ``keep``), as ``{"module", "type",
    "p"}``."""
    found: list[DropoutModule] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append({"module": name, "type": type(module).__name__, "p": module.p})
            if not keep:
                module.p = 0.0
    return found


RANDOM_FUNCTIONS = frozenset(
    {
        "dropout",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        "alpha_dropout",
        "feature_alpha_dropout",
        "rrelu",
        "gumbel_softmax",
        "rand",
        "randn",
        "randint",
        "randperm",
        "rand_like",
        "randn_like",
        "randint_like",
        "bernoulli",
        "bernoulli_",
        "normal",
        "normal_",
        "uniform_",
        "multinomial",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
        "random_",
        "poisson",
    }
)
"""torch functions and tensor methods that can draw from a generator (``torch.nn.functional`` and
``torch``)."""


class RandomOps(TorchFunctionMode):
    """Which random functions a forward calls, and in which module: every call of
    :data:`RANDOM_FUNCTIONS` that really moved the generator (``F.dropout`` with ``p=0`` draws
    nothing and is not counted)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.names = {
            id(module): name or type(module).__name__ for name, module in model.named_modules()
        }
        self.stack: list[str] = []
        self.found: dict[str, int] = {}
        self.hooks: list[RemovableHandle] = []

    def __enter__(self) -> RandomOps:
        from torch.nn.modules import module as modules

        def enter(module: nn.Module, args: tuple[Any, ...]) -> None:
            self.stack.append(self.names.get(id(module), ""))

        def leave(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.stack:
                self.stack.pop()

        self.hooks = [
            modules.register_module_forward_pre_hook(enter),
            modules.register_module_forward_hook(leave),
        ]
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks, self.stack = [], []
        result = super().__exit__(*exc)
        if "torch._dynamo" in sys.modules:
            # Code Dynamo first met under this mode may be marked to be skipped for good: forget it,
            # so what the script compiles runs compiled from the next micro-batch on, as in the
            # N-rank run.
            torch._dynamo.reset()
        return result

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Collection[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        name = getattr(func, "__name__", "")
        if name not in RANDOM_FUNCTIONS:
            return func(*args, **(kwargs or {}))
        before = torch.random.get_rng_state()
        result = func(*args, **(kwargs or {}))
        if not torch.equal(before, torch.random.get_rng_state()) or _on_cuda(args):
            where = next(
                (module for module in reversed(self.stack) if module),
                "the script, outside the model",
            )
            key = f"{name} in {where}"
            self.found[key] = self.found.get(key, 0) + 1
        return result


def _on_cuda(args: Iterable[object]) -> bool:
    """Whether a random function ran on a GPU (whose generator the CPU's state does not show)."""
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def exchange_gradients(
    directory: Path, follow: Path | None, step: int, gradients: dict[str, torch.Tensor], main: bool
) -> dict[str, torch.Tensor] | None:
    """Lockstep's gradient exchange at ``step``: the N-rank run (no ``follow``) writes its whole
    gradient from its main rank and gets ``None``; a following run gets the N-rank gradient
    (``None`` when that run ended before)."""
    if follow is None:
        if main:
            write_weights(gradients, gradients_file(directory, step))
        return None
    theirs = gradients_file(follow, step)
    return read_weights(theirs) if theirs.exists() else None


def learning_rates(optimizer: object) -> list[float | None]:
    """Each parameter group's learning rate (``None`` where a group has none)."""
    return [
        float(group["lr"]) if isinstance(group.get("lr"), (float, int, torch.Tensor)) else None
        for group in getattr(optimizer, "param_groups", [])
    ]


@dataclass
class StepRecord:
    """What one rank saw in one optimizer step: its line in ``trace.jsonl`` (every rank's, gathered
    by rank 0)."""

    samples: list[str] = field(default_factory=list)
    """One digest per sample the step trained on."""
    tokens: list[int] = field(default_factory=list)
    """Each micro-batch's tokens, where the batch says it."""
    inputs: list[str] = field(default_factory=list)
    """Where a backward consumed no DataLoader batch (a script that makes its own batches): one
    digest per row of the model's inputs in that micro-batch's training forward."""
    losses: list[float] = field(default_factory=list)
    """Every loss given to backward."""
    random_draws: int = 0
    """Micro-batches whose forward moved the random generator."""
    random_ops: dict[str, int] = field(default_factory=dict)
    """Random operations located in the forward (``"op in module"``: count)."""
    no_grad: list[str] = field(default_factory=list)
    """In a one-process run: trainable parameters without a gradient."""
    gradient: dict | None = None
    """In a following run: its gradient against the N-rank one
    (:func:`rankwise.measure.tolerance.gradient_difference`)."""
    followed: bool = False
    """Whether this step started from the N-rank weights and applied the N-rank gradient."""
    learning_rates: list = field(default_factory=list)
    """Each parameter group's learning rate at the step."""
    hyperparameters: list[dict] = field(default_factory=list)
    """Each parameter group's scalar settings at the step
    (:func:`rankwise.tools.watch.hyperparameters.hyperparameters`)."""
    schedulers: list[dict] = field(default_factory=list)
    """The state of each learning-rate scheduler driving the optimizer, before the step
    (:func:`rankwise.tools.watch.hyperparameters.schedulers`)."""

    def as_dict(self) -> dict:
        return asdict(self)


def generator_state() -> list[torch.Tensor]:
    states = [torch.random.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states.append(torch.cuda.get_rng_state())
    return states
