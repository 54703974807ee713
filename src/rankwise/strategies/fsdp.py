"""``fsdp``: PyTorch FSDP2 (``fully_shard``) with full sharding, on CUDA/NCCL or CPU/gloo.

Parameters, gradients and optimizer state are split across ranks; each layer's parameters are
all-gathered just before it runs and freed after.  Layers named in a transformers model's
``_no_split_modules`` (e.g. ``BertLayer``) become their own shard units
(:func:`rankwise.strategies.blocks.transformer_blocks`), then the root; other models are sharded as
one unit.

At ``bf16-mixed`` (``16-mixed``) the shards stay fp32 for the optimizer and FSDP's
``MixedPrecisionPolicy`` gathers them in bf16 (fp16) and reduce-scatters the gradients in fp32, as
torchtitan and Lightning configure it (:func:`mixed_precision`): half the bytes of each all-gather,
and no bf16 copy of every weight kept for the backward pass, which autocast over fp32 shards makes.
The forward still runs under the precision's autocast, as every other strategy's: the matmuls read
the same bf16 values autocast would have cast, and the ops autocast keeps in fp32 (norms, softmax,
the loss) stay in fp32.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import torch
from torch import nn
from typing_extensions import override

from rankwise import dist
from rankwise.checkpoint import WEIGHTS, CheckpointError, loading, read_weights
from rankwise.strategies import register
from rankwise.strategies.base import Strategy, retie
from rankwise.strategies.blocks import transformer_blocks
from rankwise.strategies.facts import BenchRow, Facts, StepCall

SHARDS = "sharded"
"""Where each rank writes its shards (torch.distributed.checkpoint) inside a checkpoint."""


def rebind_optimizer(
    optimizer: torch.optim.Optimizer, model: nn.Module, names_by_id: dict[int, str]
):
    """The user's optimizer, now over the model's new parameter objects: the same object, groups and
    hyper-parameters.

    ``fully_shard`` replaces every parameter with a sharded DTensor parameter, so each group's
    parameter list is swapped in place.  Not a new optimizer: a learning-rate scheduler the script
    built on this one before ``rt.prepare`` must keep driving the optimizer that steps (a rebuilt
    copy left such a scheduler changing the learning rate of an optimizer nothing stepped, and the
    run trained at the warm-up's first rate throughout).
    """
    if optimizer.state:
        raise RuntimeError(
            "fsdp: the optimizer already holds state for the unsharded parameters; build it fresh "
            "before rt.prepare and restore a checkpoint after it (rt.load_state)"
        )
    current = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [current[names_by_id[id(p)]] for p in group["params"]]
    # LBFGS keeps its (one) group's list of its own
    if isinstance(getattr(optimizer, "_params", None), list):
        optimizer._params = optimizer.param_groups[0]["params"]  # type: ignore[attr-defined]  # (LBFGS's private list)
    return optimizer


def mixed_precision(dtype: torch.dtype):
    """FSDP2's policy for a run computing in ``dtype``: at fp32 none (FSDP's defaults); at bf16 or
    fp16 the parameters gathered and computed in ``dtype``, the gradients reduce-scattered in fp32
    (a sum of N half-precision gradients would round at every rank's addition) and the fp32 shards
    kept for the optimizer, as torchtitan's ``param_dtype=bfloat16, reduce_dtype=float32``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if dtype == torch.float32:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def shard(model: nn.Module, mesh, dtype: torch.dtype = torch.float32) -> None:
    """What ``fsdp`` shards, in place: each transformer block its own unit (gathered just before it
    runs, freed after), then the root for the rest, every unit under :func:`mixed_precision`.  The
    plan shards its fake-rank copy with this same function."""
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision(dtype)
    for block in transformer_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


@register
class FSDP(Strategy):
    name = "fsdp"
    description = (
        "FSDP2 fully_shard: parameters, gradients and optimizer state sharded across ranks"
    )
    whole_state = False  # each rank saves its own shard
    # torch.distributed.checkpoint records each shard's place in the whole tensor: any world size
    reshards = True
    shards_optimizer_state = True
    strategy_facts = Facts(
        shards=frozenset({"optimizer", "gradients", "parameters"}),
        step=(
            # Each unit (every transformer block, then the root) gathers its parameters before its
            # forward, every micro-batch, in the policy's param_dtype (mixed_precision); FSDP2
            # prefetches the next unit's, so they overlap the computation.
            StepCall(
                "all_gather",
                "parameters",
                "units",
                "forward",
                "parameters, forward",
                every_micro_batch=True,
                half_at_mixed=True,
            ),
            # ...and again before its backward (the root is not resharded after its forward).
            StepCall(
                "all_gather",
                "layer-parameters",
                "layer-units",
                "backward",
                "parameters, backward",
                every_micro_batch=True,
                half_at_mixed=True,
            ),
            # The gradients are reduce-scattered once a step, in fp32 (reduce_dtype).
            StepCall("reduce_scatter", "gradients", "units", "backward", "gradients"),
            # Clipping: each rank's shards give a partial norm (a DTensor, Partial placement),
            # all-reduced once when clip_grad_norm_ reads the total (counted on gloo: one call).
            StepCall(
                "all_reduce",
                "norm",
                "one",
                "",
                "the gradients' norm, to clip them",
                when_clipping=True,
            ),
        ),
        layout="measured",  # fake tensors reach FSDP2: the plan measures it on fake ranks
        bench="smoke",
        about="FullyShardedDataParallel",
        bench_rows=(
            BenchRow("+compile", ("compile=true",), "FSDP with torch.compile after sharding"),
        ),
    )

    @property
    @override
    def gathers_layers(self) -> bool:
        return (
            True  # each unit's parameters are all-gathered for its forward and backward, then freed
        )

    @override
    def wrap(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        from torch.distributed.device_mesh import init_device_mesh

        model = model.to(self.device)
        names_by_id = {id(p): name for name, p in model.named_parameters()}
        mesh = init_device_mesh(self.device.type, (self.env.world_size,))
        shard(model, mesh, self.precision.dtype)
        if optimizer is not None:
            optimizer = rebind_optimizer(optimizer, model, names_by_id)
        return model, optimizer

    @override
    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard converts the module in place: its names stay the user's

    @property
    @override
    def library_world_size(self) -> int:
        return dist.world_size()  # FSDP2 shards over torch.distributed's own group

    @contextlib.contextmanager
    @override
    def no_sync(self, model: nn.Module):
        # Why: without the reduce-scatter on all but the last micro-batch, gradients accumulate
        # unsharded locally and are reduced once per optimizer step.  (ignore[operator]: the model
        # is fully_shard's FSDPModule; nn.Module's __getattr__ types the method as Tensor | Module.)
        model.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)  # type: ignore[operator]

    @override
    def model_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Full weights gathered from the shards (a collective: every rank must call it)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        # The gather copies each key apart: tied parameters (an LM's output layer and embedding)
        # become one again. (ignore[arg-type], here and below: torch's state-dict helpers type
        # values as ValueType, a union of tensors, DTensors and containers; a model's full state
        # dict holds tensors.)
        return retie(get_model_state_dict(model, options=options), model)  # type: ignore[arg-type]

    @override
    def load_model_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))  # type: ignore[arg-type]

    @staticmethod
    def _sharded_state(model: nn.Module, optimizer) -> dict:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if optimizer is None:
            return {"model": get_model_state_dict(model)}
        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optim": optim_state}

    # -- its checkpoint format: each rank's shards, by torch.distributed.checkpoint in SHARDS ----
    @classmethod
    @override
    def claims(cls, directory: Path) -> bool:
        return (directory / SHARDS).is_dir()

    @override
    def save_state(self, directory: Path, model: nn.Module, optimizer) -> None:
        """Each rank writes its own shards with torch.distributed.checkpoint (no gather to rank
        0)."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._sharded_state(model, optimizer), checkpoint_id=str(directory / SHARDS))

    @classmethod
    @override
    def read_whole_state(cls, directory: Path, module: nn.Module, names: list[list[str]] | None):
        """The shards regrouped whole in this process by DCP; the optimizer state is keyed by name
        already."""
        weights = read_weights(directory / WEIGHTS)
        if names is None:
            return weights, None
        optimizer_state = read_shards_whole(directory / SHARDS).get("optim")
        if optimizer_state is None:
            raise CheckpointError(
                f"{directory / SHARDS} holds no optimizer state: it was saved without an "
                "optimizer; load its weights instead (model.init_weights)"
            )
        return weights, optimizer_state

    @override
    def load_state(
        self, directory: Path, model: nn.Module, optimizer, writer: type[Strategy] | None = None
    ) -> None:
        """Each rank reads its share back; DCP regroups shards written at another world size.
        Another strategy's checkpoint (ddp's optimizer file, DeepSpeed's partitions) is read whole
        and sharded here."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if not self.claims(directory):
            super().load_state(directory, model, optimizer, writer)
            return
        state = self._sharded_state(model, optimizer)
        dcp.load(state, checkpoint_id=str(directory / SHARDS))
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
            )

    @override
    def load_whole_state(
        self, model: nn.Module, optimizer, weights: dict[str, torch.Tensor], optim: dict | None
    ) -> None:
        """Every rank keeps its shard of the whole state (``set_state_dict`` of full state
        dicts)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        if optim is None:
            self.load_model_state_dict(model, weights)
            return
        set_state_dict(
            model,
            optimizer,
            model_state_dict=weights,  # type: ignore[arg-type]
            optim_state_dict=optim,
            options=StateDictOptions(full_state_dict=True),
        )


def read_shards_whole(directory: Path) -> dict:
    """A DCP checkpoint (``directory``) read back whole in this process: ``{"model": ..., "optim":
    ...}`` with full tensors, the optimizer keyed by parameter name."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="rankwise-unshard-") as tmp:
        dcp_to_torch_save(directory, Path(tmp) / "whole.pt")
        return loading.load(Path(tmp) / "whole.pt", "FSDP checkpoint")
