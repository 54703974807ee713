"""DeepSpeed's checkpoint format: its partitions read back whole (at any world size, regrouped by
DeepSpeed's universal conversion) and a whole state, keyed by parameter name, cut into this run's
partitions; and ZeRO-3's parameters gathered a bucket at a time, to read or write them whole."""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from pathlib import Path

import torch
from torch import nn

from rankwise.checkpoint import CheckpointError, loading
from rankwise.checkpoint.convert import by_name
from rankwise.compat.deepspeed_zero import set_zero3_partition

FOLDER, TAG = "deepspeed", "state"
"""Where DeepSpeed's ``save_checkpoint`` writes every rank's ZeRO partition inside a checkpoint:
``FOLDER/TAG``."""


def read_whole(directory: Path, names: list[list[str]]) -> tuple[dict[str, torch.Tensor], dict]:
    """The weights DeepSpeed's partitions hold (fp32 masters, which under 16-bit DeepSpeed are more
    precise than the checkpoint's saved weights; ``{}`` at stage 0) and the optimizer state keyed by
    parameter name, read whole from checkpoint ``directory`` in this process.  ``names``: the
    loading run's parameters by optimizer group."""
    folder = directory / FOLDER / TAG
    if any(folder.glob("*optim_states.pt")):
        whole = read_partitions(folder)
        return whole["model"], whole["optim"]
    # ZeRO stage 0 saves the optimizer whole, beside the module.
    whole = loading.load(folder / "mp_rank_00_model_states.pt", "DeepSpeed model-state")
    # 16-bit: DeepSpeed's own wrapper with fp32 masters
    if "param_groups" not in whole["optimizer"]:
        raise CheckpointError(
            f"{directory}: DeepSpeed ZeRO stage 0 at 16-bit precision keeps its optimizer in "
            "DeepSpeed's own wrapper; continue it with the same strategy and world size"
        )
    return {}, by_name(whole["optimizer"], names)


def partitions_fit(folder: Path, world_size: int, zero_stage: int) -> bool:
    """Whether DeepSpeed wrote ``folder`` at this world size with this run's ZeRO layout (stage 3
    partitions each parameter, stages 1-2 flat groups, stage 0 none): then DeepSpeed's own load
    restores it bitwise."""
    ranks = len(list(folder.glob("zero_pp_rank_*_mp_rank_00_optim_states.pt")))
    if zero_stage == 0:
        return folder.is_dir() and ranks == 0  # whole state: loads at any world size
    per_parameter = any(folder.glob("zero_pp_rank_*_mp_rank_00_model_states.pt"))
    return ranks == world_size and per_parameter == (zero_stage == 3)


def load_whole_optimizer(
    zero, module: nn.Module, optimizer, weights: dict, optim: dict, device: torch.device
) -> None:
    """Cut this rank's share of full fp32 master weights and optimizer moments (keyed by parameter
    name) into ZeRO optimizer ``zero`` (``engine.optimizer``); ``optimizer``: the client optimizer,
    whose groups take the checkpoint's hyper-parameters."""
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    steps = {float(states["step"]) for states in optim["state"].values() if "step" in states}
    if len(steps) > 1:
        raise RuntimeError(
            "the checkpoint's parameters took different numbers of optimizer steps "
            f"{sorted(steps)}; DeepSpeed steps each flat group once, so it cannot continue them"
        )
    keys = {key for states in optim["state"].values() for key in states if key != "step"}
    _allocate_optimizer_state(zero, keys, steps.pop() if steps else None)
    parameters = dict(module.named_parameters())
    # Every stepped parameter's master weights, those without optimizer state yet (no gradient so
    # far) too.
    for name in (name for group in optim["param_groups"] for name in group["params"]):
        parameter, states = parameters[name], optim["state"].get(name, {})
        for key in [None, *(keys & states.keys())]:  # None: the fp32 master weights
            value = (weights[name] if key is None else states[key]).to(device)
            if hasattr(parameter, "ds_id"):
                set_zero3_partition(zero, parameter, value, key)
            elif key is None:
                safe_set_full_fp32_param(parameter, value)
            else:
                safe_set_full_optimizer_state(parameter, value, key)
    for group, saved in zip(optimizer.param_groups, optim["param_groups"], strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})


def _allocate_optimizer_state(zero, keys: set[str], step: float | None) -> None:
    """Give the inner optimizer's flat partitions the state a first step would create (zeros), so
    that DeepSpeed's setters have tensors to write into; ``step``: the checkpoint's step count."""
    inner = zero.optimizer  # torch's optimizer over the flat fp32 partitions
    # ZeRO-3 hands its sub-groups' partitions to the inner optimizer only while it steps.
    partitions = getattr(zero, "fp32_partitioned_groups_flat", None) or [
        partition for group in inner.param_groups for partition in group["params"]
    ]
    # torch keeps the step on the parameter's device only for fused / capturable steps.
    on_device = any(group.get("fused") or group.get("capturable") for group in inner.param_groups)
    for partition in partitions:
        state = inner.state[partition]
        for key in keys - state.keys():
            state[key] = torch.zeros_like(partition)
        if step is not None:
            state["step"] = torch.tensor(
                step, dtype=torch.float32, device=partition.device if on_device else "cpu"
            )
    # ZeRO 1-2 link each parameter to its state slice lazily
    if hasattr(zero, "_hp_optimizer_states_linked"):
        zero._hp_optimizer_states_linked = False
        zero._lazy_init_hp_params_optimizer_state()


def chunks_of(params: list[nn.Parameter], elements: int):
    """Consecutive groups of parameters of about ``elements`` elements (a larger one alone)."""
    chunk: list[nn.Parameter] = []
    size = 0
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
    ``elements`` at a time while that bucket is gathered in full (a collective: every rank
    iterates)."""
    import deepspeed

    unique = list({id(p): p for p in state.values() if isinstance(p, nn.Parameter)}.values())
    for chunk in chunks_of(unique, elements):
        # Why: one bucket at a time, so no rank ever holds the whole model gathered (the point of
        # ZeRO-3).
        with deepspeed.zero.GatheredParameters(chunk, modifier_rank=modifier_rank):
            yield chunk


def read_partitions(folder: Path) -> dict:
    """A DeepSpeed ZeRO 1-3 checkpoint (``folder``: the tag folder ``save_checkpoint`` wrote, every
    rank's partition) read back whole in this process: ``{"model": fp32 master weights by name,
    "optim": state keyed by parameter name}``, whatever world size wrote it.

    DeepSpeed's ``ds_to_universal`` does the regrouping (it knows each partition's padding and
    layout); it runs here, in-process, into a temporary folder, and its per-parameter files are read
    back.
    """
    from deepspeed.checkpoint import ds_to_universal

    shapes = _deepspeed_parameter_shapes(folder)
    names = [list(group) for group in shapes]
    with tempfile.TemporaryDirectory(prefix="rankwise-regroup-") as tmp:
        out = Path(tmp) / "universal"
        args = argparse.Namespace(
            input_folder=str(folder),
            output_folder=str(out),
            num_extract_workers=1,
            num_merge_workers=1,
            keep_temp_folder=False,
            strict=True,
            # rankwise's saves carry no Megatron metadata
            inject_missing_state=True,
        )
        log = io.StringIO()
        # DeepSpeed's conversion unpickles them fully
        loading.check_safe(folder.glob("*.pt"), "DeepSpeed")
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                ds_to_universal.main(args)
        except Exception as e:  # noqa: BLE001 - any failure of the conversion is the checkpoint's to report
            raise CheckpointError(
                f"cannot regroup DeepSpeed's partitions in {folder} for another world size or "
                f"strategy: {type(e).__name__}: {e}\n{log.getvalue()[-2000:]}"
            ) from None
        zero = out / "zero"
        common = loading.load(zero / "optimizer_state.pt", "DeepSpeed optimizer-state")
        # ZeRO-3 nests the torch optimizer's own dict
        saved = common.get("optimizer_state_dict", common)
        model, state = {}, {}
        for group_index, group_names in enumerate(names):
            group_step = saved.get("state", {}).get(group_index, {}).get("step")
            for name in group_names:
                shape = shapes[group_index][name]  # ZeRO-3 writes flat tensors
                tensors = {
                    file.stem: _tensor(loading.load(file, "DeepSpeed parameter-state"), shape)
                    for file in sorted((zero / name).glob("*.pt"))
                }
                model[name] = tensors.pop("fp32").detach()
                if "step" not in tensors and group_step is not None:
                    tensors["step"] = group_step
                state[name] = tensors
        groups = [
            {**{k: v for k, v in group.items() if k != "params"}, "params": list(group_names)}
            for group, group_names in zip(saved["param_groups"], names, strict=True)
        ]
    return {"model": model, "optim": {"state": state, "param_groups": groups}}


def _tensor(loaded, shape: torch.Size) -> torch.Tensor:
    """A universal-checkpoint file's tensor in its parameter's shape (ZeRO 1-2 wrap it as
    ``{"param": tensor, "cat_dim": ...}``); a scalar (the step) stays one."""
    tensor = loaded["param"] if isinstance(loaded, dict) else loaded
    return tensor.reshape(shape) if tensor.dim() else tensor


def _deepspeed_parameter_shapes(folder: Path) -> list[dict[str, torch.Size]]:
    """Each optimizer group's parameters (name -> shape), in DeepSpeed's order, from a model-states
    file."""
    files = sorted(folder.glob("*model_states.pt"))
    if not files:
        raise CheckpointError(f"{folder} holds no DeepSpeed model states (*model_states.pt)")
    shapes = loading.load(files[0], "DeepSpeed model-state").get("param_shapes")
    if not shapes:
        raise CheckpointError(
            f"{files[0]} records no parameter shapes: not a ZeRO checkpoint DeepSpeed can regroup"
        )
    return [dict(group) for group in shapes]
