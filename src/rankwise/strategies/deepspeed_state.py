"""DeepSpeed ZeRO state cut from a whole checkpoint: another world size's partitions (regrouped by
``checkpoint.convert.read_deepspeed``) or another strategy's state, keyed by parameter name; and ZeRO-3's
parameters gathered a bucket at a time, to read or write them whole."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def partitions_fit(folder: Path, world_size: int, zero_stage: int) -> bool:
    """Whether DeepSpeed wrote ``folder`` at this world size with this run's ZeRO layout (stage 3 partitions each
    parameter, stages 1-2 flat groups, stage 0 none): then DeepSpeed's own load restores it bitwise."""
    ranks = len(list(folder.glob("zero_pp_rank_*_mp_rank_00_optim_states.pt")))
    if zero_stage == 0:
        return folder.is_dir() and ranks == 0  # whole state: loads at any world size
    per_parameter = any(folder.glob("zero_pp_rank_*_mp_rank_00_model_states.pt"))
    return ranks == world_size and per_parameter == (zero_stage == 3)


def load_whole_optimizer(zero, module: nn.Module, optimizer, weights: dict, optim: dict,
                         device: torch.device) -> None:
    """Cut this rank's share of full fp32 master weights and optimizer moments (keyed by parameter name) into
    ZeRO optimizer ``zero`` (``engine.optimizer``); ``optimizer``: the client optimizer, whose groups take the
    checkpoint's hyper-parameters."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    steps = {float(states["step"]) for states in optim["state"].values() if "step" in states}
    if len(steps) > 1:
        raise RuntimeError(f"the checkpoint's parameters took different numbers of optimizer steps {sorted(steps)}; "
                           "DeepSpeed steps each flat group once, so it cannot continue them")
    keys = {key for states in optim["state"].values() for key in states if key != "step"}
    _allocate_optimizer_state(zero, keys, steps.pop() if steps else None)
    parameters = dict(module.named_parameters())
    # Every stepped parameter's master weights, those without optimizer state yet (no gradient so far) too.
    for name in (name for group in optim["param_groups"] for name in group["params"]):
        parameter, states = parameters[name], optim["state"].get(name, {})
        for key in [None, *(keys & states.keys())]:  # None: the fp32 master weights
            value = (weights[name] if key is None else states[key]).to(device)
            if hasattr(parameter, "ds_id"):
                _set_zero3_partition(zero, parameter, value, key)
            elif key is None:
                safe_set_full_fp32_param(parameter, value)
            else:
                safe_set_full_optimizer_state(parameter, value, key)
    for group, saved in zip(optimizer.param_groups, optim["param_groups"], strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})


def _set_zero3_partition(zero, parameter: nn.Parameter, value: torch.Tensor, key: str | None) -> None:
    """This rank's slice of a full ZeRO-3 master weight (``key`` None) or optimizer state.  DeepSpeed's own
    ``safe_set_full_*`` reads past the end of an unpadded value on the last rank of a parameter whose size does
    not divide by the world size (0.19.8: "start (68) + length (34) exceeds dimension size (100)")."""
    partition, _ = zero._get_fp32_opt_state_partition(parameter, release_swap_buffers=False, optim_state_key=key)
    padded = value.new_zeros(partition.numel() * zero._get_param_partition_world_size(parameter))
    padded[:value.numel()] = value.flatten()
    rank = zero._get_param_partition_rank(parameter)
    partition.data.copy_(padded.narrow(0, partition.numel() * rank, partition.numel()))


def _allocate_optimizer_state(zero, keys: set[str], step: float | None) -> None:
    """Give the inner optimizer's flat partitions the state a first step would create (zeros), so that
    DeepSpeed's setters have tensors to write into; ``step``: the checkpoint's step count."""
    inner = zero.optimizer  # torch's optimizer over the flat fp32 partitions
    # ZeRO-3 hands its sub-groups' partitions to the inner optimizer only while it steps.
    partitions = getattr(zero, "fp32_partitioned_groups_flat", None) or \
        [partition for group in inner.param_groups for partition in group["params"]]
    # torch keeps the step on the parameter's device only for fused / capturable steps.
    on_device = any(group.get("fused") or group.get("capturable") for group in inner.param_groups)
    for partition in partitions:
        state = inner.state[partition]
        for key in keys - state.keys():
            state[key] = torch.zeros_like(partition)
        if step is not None:
            state["step"] = torch.tensor(step, dtype=torch.float32, device=partition.device if on_device else "cpu")
    if hasattr(zero, "_hp_optimizer_states_linked"):  # ZeRO 1-2 link each parameter to its state slice lazily
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()


def chunks_of(params: list[nn.Parameter], elements: int):
    """Consecutive groups of parameters of about ``elements`` elements (a larger one alone)."""
    chunk, size = [], 0
    for param in params:
        numel = param.ds_numel if hasattr(param, "ds_numel") else param.numel()
        if chunk and size + numel > elements:
            yield chunk
            chunk, size = [], 0
        chunk.append(param)
        size += numel
    if chunk:
        yield chunk


def gathered_buckets(state: dict, elements: int, modifier_rank: int | None):
    """The distinct parameters of a ZeRO-3 ``state_dict(keep_vars=True)``, yielded a bucket of about
    ``elements`` at a time while that bucket is gathered in full (a collective: every rank iterates)."""
    import deepspeed
    unique = list({id(p): p for p in state.values() if isinstance(p, nn.Parameter)}.values())
    for chunk in chunks_of(unique, elements):
        # Why: one bucket at a time, so no rank ever holds the whole model gathered (the point of ZeRO-3).
        with deepspeed.zero.GatheredParameters(chunk, modifier_rank=modifier_rank):
            yield chunk
