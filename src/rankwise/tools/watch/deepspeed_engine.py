"""The watcher in a DeepSpeed-engine script (``deepspeed.initialize``, ``engine.backward(loss)``,
``engine.step()``), unchanged.

The engine steps its own copies of the weights: under ZeRO 1-2 (and bf16) an fp32 master partition
per rank that torch's optimizer hooks only see flattened.  So here a step is ``engine.step()`` at a
gradient-accumulation boundary (:func:`watch`), and DeepSpeed itself names each parameter's whole
state (``deepspeed.utils``): the gradient the engine is about to apply, averaged over the ranks and
unscaled (``safe_get_full_grad``), the fp32 weights after it (``safe_get_full_fp32_param``).  The
one-process reference (the same script, the same config, at world size 1) takes the N-rank gradient
before its step (``safe_set_full_grad``) and the N-rank weights after it: the module's (what its
forward uses) and the engine's fp32 masters (``safe_set_full_fp32_param``, what its next step
updates).  The loss is the one ``engine.backward`` passes to torch's backward (divided by the
accumulation steps, as DeepSpeed does in both runs).

ZeRO-3 partitions the module's own parameters too (empty placeholders outside the engine's forward):
their whole weights are gathered the same way, and the one-process reference, whose one partition is
the whole parameter, writes the N-rank run's into that partition and into its fp32 master
(:func:`rankwise.tools.watch.ranks.assign`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from rankwise.compat.deepspeed_zero import skip_shm_comm_build
from rankwise.tools.watch.ranks import assign, partitioned, patch

if TYPE_CHECKING:
    # (DeepSpeed ships no types: its engine is Any to mypy)
    from deepspeed.runtime.engine import DeepSpeedEngine

    from rankwise.tools.watch.watcher_view import WatcherView

ENVIRONMENT = "RANKWISE_WATCH_DEEPSPEED"
"""Set (to 1) in a watched rank of a DeepSpeed-engine script."""


def watch(watcher: WatcherView) -> None:
    """Watch every DeepSpeed engine the script builds (``watcher``: the rank's
    :class:`~rankwise.tools.watch.watcher.Watcher`)."""
    skip_shm_comm_build()  # (before the script's init_distributed: a kernel only inference uses)
    from deepspeed.runtime.engine import DeepSpeedEngine

    patch(DeepSpeedEngine, "forward", lambda original: _forward(watcher, original))
    patch(DeepSpeedEngine, "backward", lambda original: _backward(watcher, original))
    patch(DeepSpeedEngine, "step", lambda original: _step(watcher, original))


def _backward(watcher: WatcherView, original: Callable[..., Any]) -> Callable[..., Any]:
    def backward(engine: DeepSpeedEngine, loss: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = original(engine, loss, *args, **kwargs)
        # (DeepSpeed back-propagated a copy of the loss, divided by the accumulation steps and
        # scaled: the script reads the one it passed, as a per-rank metric where it prints it)
        watcher.calls.metrics.loss_seen(loss)
        return result

    return backward


def _named(engine: DeepSpeedEngine) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p in engine.module.named_parameters() if p.requires_grad]


def _stage(engine: DeepSpeedEngine) -> int:
    return int(engine.zero_optimization_stage())


def _forward(watcher: WatcherView, original: Callable[..., Any]) -> Callable[..., Any]:
    def forward(engine: DeepSpeedEngine, *args: Any, **kwargs: Any) -> Any:
        if not getattr(engine, "_rankwise_seen", False):
            engine._rankwise_seen = True
            stage = _stage(engine)
            watcher.facts.update(
                {
                    "api": "deepspeed",
                    "strategy": f"DeepSpeed ZeRO-{stage} (the script's config)",
                    "shards_optimizer_state": stage >= 1,
                    "precision": "bf16-true"
                    if engine.bfloat16_enabled()
                    else "16-mixed"
                    if engine.fp16_enabled()
                    else "32-true",
                }
            )
            if watcher.settings.trace and watcher.lockstep.follow is not None:
                # The watcher's first forward gave the module the N-rank run's initial weights; the
                # engine's fp32 masters (what its first step updates) were copied before that: they
                # take them too. (A ZeRO-3 parameter took them into its master with its partition:
                # see assign.)
                _set_masters(
                    engine,
                    {name: p.detach().float() for name, p in _named(engine) if not partitioned(p)},
                )
        return original(engine, *args, **kwargs)

    return forward


def _set_masters(engine: DeepSpeedEngine, weights: dict[str, torch.Tensor]) -> None:
    from deepspeed.utils import safe_set_full_fp32_param

    if not _stage(engine) and not engine.bfloat16_enabled() and not engine.fp16_enabled():
        return  # (ZeRO-0 in fp32: the client optimizer steps the module's own parameters)
    for name, parameter in _named(engine):
        if name in weights:
            safe_set_full_fp32_param(parameter, weights[name].to(parameter.device))


def _or(value: torch.Tensor | None, default: torch.Tensor) -> torch.Tensor:
    return default if value is None else value


def _scale(engine: DeepSpeedEngine) -> float:
    """The loss scale of an fp16 engine (its gradients are scaled until its step), else 1."""
    return float(getattr(engine.optimizer, "cur_scale", 1.0)) if engine.fp16_enabled() else 1.0


def _step(watcher: WatcherView, original: Callable[..., Any]) -> Callable[..., Any]:
    def step(engine: DeepSpeedEngine, *args: Any, **kwargs: Any) -> Any:
        if not engine.is_gradient_accumulation_boundary():
            return original(engine, *args, **kwargs)  # (a micro-step: DeepSpeed only counts it)
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_grad, safe_set_full_grad

        named = _named(engine)
        # (torch's hooks see DeepSpeed's inner optimizer over flat partitions)
        watcher.step_watch.runtime_step_begins()
        watcher.step_begins(engine.optimizer, [])
        if watcher.tracing:
            scale = _scale(engine)
            # Why: every rank takes part in each gather (ZeRO keeps each gradient partitioned); rank
            # 0 writes them.
            gradients = {name: safe_get_full_grad(p) for name, p in named}
            applied = watcher.exchange(
                {
                    name: g.detach().float().cpu() / scale
                    for name, g in gradients.items()
                    if g is not None
                }
            )
            if applied is not None:
                # The reference steps with the N-rank gradient from the N-rank weights: the weights
                # after the step must match what the N-rank engine did with it (clipping included),
                # to rounding.
                for name, parameter in named:
                    if name in applied:
                        safe_set_full_grad(
                            parameter,
                            (applied[name] * scale).reshape(_shape(parameter)).to(parameter.device),
                        )
                watcher.step_watch.mark_followed()
        try:
            result = original(engine, *args, **kwargs)
        finally:
            watcher.step_watch.runtime_step_ends()

        def weights() -> dict[str, torch.Tensor]:
            # Why: a gather of each parameter's fp32 master on every rank (a collective under ZeRO
            # 1-2). (ZeRO-0 in fp32 keeps no masters: its parameters are the weights)
            return {
                name: _or(safe_get_full_fp32_param(p), p).detach().float().cpu()
                for name, p in named
            }

        def follow(theirs: dict[str, torch.Tensor]) -> None:
            with torch.no_grad():
                for name, parameter in named:
                    if name in theirs and not partitioned(parameter):
                        parameter.copy_(
                            theirs[name]
                            .reshape(parameter.shape)
                            .to(parameter.device, parameter.dtype)
                        )
                    elif name in theirs:
                        assign(parameter, theirs[name])
            _set_masters(engine, theirs)

        watcher.step_ends([p for _, p in named], weights, follow)
        return result

    return step


def _shape(parameter: torch.Tensor) -> torch.Size:
    # ignore[attr-defined]: DeepSpeed ZeRO-3 gives its parameters ds_shape (their whole shape)
    return parameter.ds_shape if partitioned(parameter) else parameter.shape  # type: ignore[attr-defined]
