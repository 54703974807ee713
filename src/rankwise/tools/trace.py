"""What the Runtime records step by step when ``rankwise verify`` asks where N ranks and one process part.

Switched on with the probe (:mod:`rankwise.tools.probe`) and ``RANKWISE_PROBE_TRACE=1``.  For every
optimizer step each rank keeps:

* one digest per sample of every batch the script passes through ``rt.to_device`` while
  gradients are on (evaluation under ``no_grad`` is left out); padding is not part of a sample,
  so a sample padded to another batch's length keeps its digest;
* the tokens of each micro-batch, where the batch says it (``labels`` with -100, ``attention_mask``);
* every loss value given to ``rt.backward``;
* how many micro-batches drew random numbers between ``to_device`` and ``backward`` (the generator moved);
* in a one-process run, the trainable parameters that got no gradient;

and rank 0 writes the full fp32 weights after the step (``step-00000`` as prepared) and the gradients the
step applied, whole, as the ranks exchanged them (``grad-00001``: what every rank's optimizer received).
Dropout modules are switched off (p=0) unless ``RANKWISE_PROBE_DROPOUT=keep``; the trace says which.

A one-process run given ``RANKWISE_PROBE_FOLLOW`` (a traced N-rank run's directory) follows that run in
lockstep: it starts each step from the N-rank run's weights after the step before, computes its own
gradient there and compares it with the N-rank gradient (:func:`rankwise.tolerance.gradient_difference`),
then steps its own optimizer with the N-rank gradient.  So what each step's comparison shows is that one
step's difference, never rounding compounded over the steps before it, and the weights after the step
tell whether the N-rank optimizer applied the same gradient as one process would.  In its first step the
one-process run also records which random operations its forward ran, and in which module.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from rankwise.checkpoint import read_weights, write_text_atomic, write_weights
from rankwise.samples import sample_digests, token_count
from rankwise.tolerance import gradient_difference

TRACE, DROPOUT, FOLLOW = "RANKWISE_PROBE_TRACE", "RANKWISE_PROBE_DROPOUT", "RANKWISE_PROBE_FOLLOW"
TRACE_FILE, FACTS_FILE = "trace.jsonl", "trace-facts.json"


def _batch_dependent(module: nn.Module) -> bool:
    """BatchNorm normalises over the batch; InstanceNorm only keeps running statistics over it (when it tracks them)."""
    if isinstance(module, nn.SyncBatchNorm):
        return False
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return True
    return isinstance(module, nn.modules.instancenorm._InstanceNorm) and module.track_running_stats


def model_facts(model: nn.Module) -> dict:
    """What a model holds that can make N ranks compute something else than one process."""
    batch_dependent = sorted({type(m).__name__ for m in model.modules() if _batch_dependent(m)})
    dropout = sorted({type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.dropout._DropoutNd)
                      and m.p > 0})
    return {"batch_dependent": batch_dependent, "dropout": dropout}


def uses_tf32(model: nn.Module, device: torch.device) -> bool:
    """Whether fp32 products of this model run on TF32 units: on CUDA, matrix products where torch allows it
    (off by default), convolutions where cuDNN does (on by default)."""
    if device.type != "cuda":
        return False
    convolutions = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    return torch.backends.cuda.matmul.allow_tf32 or (convolutions and torch.backends.cudnn.allow_tf32)


def weights_file(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:05d}.safetensors"


def gradients_file(directory: Path, step: int) -> Path:
    return Path(directory) / f"grad-{step:05d}.safetensors"


def _generator_state(device: torch.device) -> list[torch.Tensor]:
    states = [torch.random.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def switch_off_dropout(model: nn.Module, keep: bool) -> list[dict]:
    """Every dropout module with p > 0 (set to 0 unless ``keep``), as ``{"module", "type", "p"}``."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            found.append({"module": name, "type": type(module).__name__, "p": module.p})
            if not keep:
                module.p = 0.0
    return found


RANDOM_FUNCTIONS = frozenset({
    "dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout", "rrelu",
    "gumbel_softmax", "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli",
    "bernoulli_", "normal", "normal_", "uniform_", "multinomial", "exponential_", "geometric_", "cauchy_",
    "log_normal_", "random_", "poisson"})
"""torch functions and tensor methods that can draw from a generator (``torch.nn.functional`` and ``torch``)."""


class RandomOps(TorchFunctionMode):
    """Which random functions a forward calls, and in which module: every call of :data:`RANDOM_FUNCTIONS` that
    really moved the generator (``F.dropout`` with ``p=0`` draws nothing and is not counted)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.names = {id(module): name or type(module).__name__ for name, module in model.named_modules()}
        self.stack: list[str] = []
        self.found: dict[str, int] = {}
        self.hooks = []

    def __enter__(self):
        from torch.nn.modules import module as modules

        def enter(module, args):
            self.stack.append(self.names.get(id(module), ""))

        def leave(module, args, output):
            if self.stack:
                self.stack.pop()

        self.hooks = [modules.register_module_forward_pre_hook(enter), modules.register_module_forward_hook(leave)]
        return super().__enter__()

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()
        self.hooks, self.stack = [], []
        result = super().__exit__(*exc)
        if "torch._dynamo" in sys.modules:
            # Code Dynamo first met under this mode may be marked to be skipped for good: forget it, so what the
            # script compiles runs compiled from the next micro-batch on, as in the N-rank run.
            torch._dynamo.reset()
        return result

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in RANDOM_FUNCTIONS:
            return func(*args, **(kwargs or {}))
        before = torch.random.get_rng_state()
        result = func(*args, **(kwargs or {}))
        if not torch.equal(before, torch.random.get_rng_state()) or _on_cuda(args):
            where = next((module for module in reversed(self.stack) if module), "the script, outside the model")
            key = f"{name} in {where}"
            self.found[key] = self.found.get(key, 0) + 1
        return result


def _on_cuda(args) -> bool:
    """Whether a random function ran on a GPU (whose generator the CPU's state does not show)."""
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def exchange_gradients(directory: Path, follow: Path | None, step: int, gradients: dict[str, torch.Tensor],
                       main: bool) -> dict[str, torch.Tensor] | None:
    """Lockstep's gradient exchange at ``step``: the N-rank run (no ``follow``) writes its whole gradient from its main
    rank and gets ``None``; a following run gets the N-rank gradient (``None`` when that run ended before)."""
    if follow is None:
        if main:
            write_weights(gradients, gradients_file(directory, step))
        return None
    theirs = gradients_file(follow, step)
    return read_weights(theirs) if theirs.exists() else None


def learning_rates(optimizer) -> list[float | None]:
    """Each parameter group's learning rate (``None`` where a group has none)."""
    return [float(group["lr"]) if isinstance(group.get("lr"), (float, int, torch.Tensor)) else None
            for group in getattr(optimizer, "param_groups", [])]


@dataclass
class StepRecord:
    """What one rank saw in one optimizer step: its line in ``trace.jsonl`` (every rank's, gathered by rank 0)."""

    samples: list[str] = field(default_factory=list)
    """One digest per sample the step trained on."""
    tokens: list[int] = field(default_factory=list)
    """Each micro-batch's tokens, where the batch says it."""
    losses: list[float] = field(default_factory=list)
    """Every loss given to backward."""
    random_draws: int = 0
    """Micro-batches whose forward moved the random generator."""
    random_ops: dict[str, int] = field(default_factory=dict)
    """Random operations located in the forward (``"op in module"``: count)."""
    no_grad: list[str] = field(default_factory=list)
    """In a one-process run: trainable parameters without a gradient."""
    gradient: dict | None = None
    """In a following run: its gradient against the N-rank one (:func:`rankwise.tolerance.gradient_difference`)."""
    followed: bool = False
    """Whether this step started from the N-rank weights and applied the N-rank gradient."""
    learning_rates: list = field(default_factory=list)
    """Each parameter group's learning rate at the step."""

    def as_dict(self) -> dict:
        return asdict(self)


class StepTrace:
    def __init__(self, directory: str | Path, keep_dropout: bool, follow: str | Path | None = None):
        self.directory, self.keep_dropout = Path(directory), keep_dropout
        self.follow = Path(follow) if follow else None
        """The traced N-rank run this one-process run follows in lockstep; ``None`` for the N-rank run itself."""
        self._state: list[torch.Tensor] | None = None
        self._random: RandomOps | None = None
        self._model: nn.Module | None = None
        self.steps_done = 0
        self.facts: dict = {"dropout": [], "dropout_kept": keep_dropout, "half_params": [], "batch_dependent": []}
        self._models = 0
        self._reset()

    def _reset(self) -> None:
        self.record = StepRecord()

    def prepared(self, rt, model: nn.Module) -> None:
        """Before the strategy wraps ``model`` (every rank): dropout off, the facts; the first model's weights as
        prepared are step 0."""
        self._models += 1
        facts = self.facts
        facts["dropout"] += switch_off_dropout(model, self.keep_dropout)
        facts["half_params"] = sorted(set(facts["half_params"]) | {
            str(p.dtype).removeprefix("torch.") for p in model.parameters()
            if p.requires_grad and p.dtype in (torch.float16, torch.bfloat16)})
        facts["batch_dependent"] = sorted(set(facts["batch_dependent"]) | set(model_facts(model)["batch_dependent"]))
        facts |= {"precision": rt.strategy.precision.name, "device": rt.device.type,
                  "comm_hook": str(getattr(rt.strategy.options, "comm_hook", "none")),
                  "tf32": facts.get("tf32", False) or uses_tf32(model, rt.device),
                  "shards_optimizer_state": rt.strategy.shards_optimizer_state}
        first = self._models == 1
        if rt.is_main:
            state = model.state_dict()
            if first and not any(t.is_meta for t in state.values()):
                write_weights({k: v.detach().float().cpu() for k, v in state.items()}, weights_file(self.directory, 0))
            write_text_atomic(self.directory / FACTS_FILE, json.dumps(facts, indent=2))
        if first:
            self._model = model
            if self.follow and weights_file(self.follow, 0).exists():
                # Lockstep from the start: step 1 runs from the N-rank run's weights as prepared.
                model.load_state_dict(read_weights(weights_file(self.follow, 0)))

    def batch(self, batch, device: torch.device) -> None:
        if not torch.is_grad_enabled():
            return
        self.record.samples.extend(sample_digests(batch))
        tokens = token_count(batch)
        if tokens is not None:
            self.record.tokens.append(tokens)
        self._state = _generator_state(device)
        if self._locating and self._random is None:
            self._random = RandomOps(self._model)
            self._random.__enter__()

    @property
    def _locating(self) -> bool:
        """Watch the forward's random operations: in the one-process run's first step, eagerly."""
        # (not around a forward compiled in place: a torch-function mode there would only break its graph)
        return (self.follow is not None and self._model is not None and not self.steps_done
                and not hasattr(self._model.forward, "_torchdynamo_orig_callable"))

    def _stop_locating(self) -> None:
        if self._random is not None:
            self._random.__exit__(None, None, None)
            for key, count in self._random.found.items():
                self.record.random_ops[key] = self.record.random_ops.get(key, 0) + count
            self._random = None

    def backward(self, loss: torch.Tensor, device: torch.device) -> None:
        self._stop_locating()
        self.record.losses.append(float(loss.detach().float().sum()))
        if self._state is not None:
            now = _generator_state(device)
            self.record.random_draws += any(not torch.equal(a, b) for a, b in zip(self._state, now, strict=True))
            self._state = None

    def before_step(self, rt, model: nn.Module, optimizer) -> None:
        """Between the step's last backward and its optimizer step (every rank)."""
        self._stop_locating()
        self.record.learning_rates = learning_rates(optimizer)
        if rt.world_size == 1:
            self.record.no_grad = [name.removeprefix("module.") for name, p in model.named_parameters()
                            if p.requires_grad and p.grad is None]
        gradients = rt.strategy.full_gradients(model)  # a collective where gradients are sharded
        applied = exchange_gradients(self.directory, self.follow, rt.steps + 1, gradients, rt.is_main)
        if applied is None:  # the N-rank run itself, or it ended before this step: from here on this run goes alone
            self.follow = None
            return
        self.record.gradient = gradient_difference(applied, gradients)
        # The step applies the N-rank gradient: with the same weights and optimizer state before it, the weights
        # after it must match whatever the N-rank optimizer did with it, to rounding.  (Both are unscaled: under a
        # 16-bit loss scale this run's own scale goes back on, for its step to take off.)
        scale = rt.strategy.gradient_scale()
        for name, param in rt.strategy.unwrap(model).named_parameters():
            grad = applied.get(name)
            param.grad = None if grad is None else (grad.reshape(param.shape) * scale).to(param.device, param.dtype)
        self.record.followed = True

    def stepped(self, rt, model: nn.Module) -> None:
        """After optimizer step ``rt.steps`` (every rank): rank 0 appends every rank's record and the weights."""
        # Why: rank 0 writes what every rank saw in this step.
        records = rt.all_gather_object(self.record.as_dict())
        weights = rt.state_dict(model)  # a collective for sharded strategies
        if rt.is_main:
            write_weights({k: v.float() for k, v in weights.items()}, weights_file(self.directory, rt.steps))
            with open(self.directory / TRACE_FILE, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": rt.steps, "ranks": records}) + "\n")
        self.steps_done = rt.steps
        if self.follow is not None and weights_file(self.follow, rt.steps).exists():
            # Lockstep: the next step starts from the N-rank run's weights, so rounding never compounds.
            rt.strategy.load_model_state_dict(model, read_weights(weights_file(self.follow, rt.steps)))
        self._reset()
