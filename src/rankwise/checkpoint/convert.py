"""Whole optimizer state in torch's two spellings, and FSDP's shards and DeepSpeed's partitions read back whole.

Whole-state strategies save ``optimizer.state_dict()``: states keyed by each parameter's index in
the optimizer's groups.  FSDP saves, through ``torch.distributed.checkpoint.state_dict``, states
keyed by parameter name (sharded tensors, written per rank by DCP).  A checkpoint moves between the
two through the names: the script builds the same optimizer over the same model on both sides, so
the i-th parameter of the optimizer is the same named parameter.  DeepSpeed's ZeRO partitions are
regrouped by DeepSpeed's own universal-checkpoint conversion into the same by-name form.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from pathlib import Path

import torch
from torch import nn

from rankwise.checkpoint import loading
from rankwise.errors import CheckpointError


def parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The name of every parameter of each of ``optimizer``'s groups, in the optimizer's order (``model``
    unwrapped, holding the very parameters the optimizer steps)."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    try:
        return [[names[id(parameter)] for parameter in group["params"]] for group in optimizer.param_groups]
    except KeyError:
        raise CheckpointError("the optimizer steps a parameter the model lacks: its state has no name") from None


def _check_groups(state: dict, names: list[list[str]]) -> None:
    saved, expected = [len(group["params"]) for group in state["param_groups"]], [len(group) for group in names]
    if saved != expected:
        raise CheckpointError(f"the checkpoint's optimizer has groups of {saved} parameters, this run's optimizer "
                              f"groups of {expected}: build the same optimizer to resume")


def by_name(state: dict, names: list[list[str]]) -> dict:
    """``optimizer.state_dict()`` (keyed by index) keyed by parameter name instead."""
    _check_groups(state, names)
    name_of = {index: name for group, group_names in zip(state["param_groups"], names, strict=True)
               for index, name in zip(group["params"], group_names, strict=True)}
    return {"state": {name_of[index]: value for index, value in state["state"].items()},
            "param_groups": [{**group, "params": [name_of[i] for i in group["params"]]}
                             for group in state["param_groups"]]}


def by_index(state: dict, names: list[list[str]]) -> dict:
    """Optimizer state keyed by parameter name keyed by this optimizer's indices, for ``load_state_dict``."""
    _check_groups(state, names)
    index_of = {name: index for index, name in enumerate(name for group in names for name in group)}
    missing = sorted({name for group in state["param_groups"] for name in group["params"]} - set(index_of))
    if missing:
        raise CheckpointError(f"the checkpoint's optimizer holds state of {missing[:5]}, which this model lacks")
    return {"state": {index_of[name]: value for name, value in state["state"].items()},
            "param_groups": [{**group, "params": [index_of[name] for name in group["params"]]}
                             for group in state["param_groups"]]}


def read_sharded(directory: Path) -> dict:
    """FSDP's DCP checkpoint (``directory``) read back whole in this process: ``{"model": ..., "optim": ...}``
    with full tensors, the optimizer keyed by parameter name."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="rankwise-unshard-") as tmp:
        dcp_to_torch_save(directory, Path(tmp) / "whole.pt")
        return loading.load(Path(tmp) / "whole.pt", "FSDP checkpoint")


def read_deepspeed(folder: Path) -> dict:
    """A DeepSpeed ZeRO 1-3 checkpoint (``folder``: the tag folder ``save_checkpoint`` wrote, every rank's
    partition) read back whole in this process: ``{"model": fp32 master weights by name, "optim": state keyed
    by parameter name}``, whatever world size wrote it.

    DeepSpeed's ``ds_to_universal`` does the regrouping (it knows each partition's padding and layout); it
    runs here, in-process, into a temporary folder, and its per-parameter files are read back.
    """
    from deepspeed.checkpoint import ds_to_universal

    shapes = _deepspeed_parameter_shapes(folder)
    names = [list(group) for group in shapes]
    with tempfile.TemporaryDirectory(prefix="rankwise-regroup-") as tmp:
        out = Path(tmp) / "universal"
        args = argparse.Namespace(input_folder=str(folder), output_folder=str(out), num_extract_workers=1,
                                  num_merge_workers=1, keep_temp_folder=False, strict=True,
                                  inject_missing_state=True)  # rankwise's saves carry no Megatron metadata
        log = io.StringIO()
        loading.check_safe(folder.glob("*.pt"), "DeepSpeed")  # DeepSpeed's conversion unpickles them fully
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                ds_to_universal.main(args)
        except Exception as e:  # noqa: BLE001 - any failure of the conversion is the checkpoint's to report
            raise CheckpointError(f"cannot regroup DeepSpeed's partitions in {folder} for another world size or "
                                  f"strategy: {type(e).__name__}: {e}\n{log.getvalue()[-2000:]}") from None
        zero = out / "zero"
        common = loading.load(zero / "optimizer_state.pt", "DeepSpeed optimizer-state")
        saved = common.get("optimizer_state_dict", common)  # ZeRO-3 nests the torch optimizer's own dict
        model, state = {}, {}
        for group_index, group_names in enumerate(names):
            group_step = saved.get("state", {}).get(group_index, {}).get("step")
            for name in group_names:
                shape = shapes[group_index][name]  # ZeRO-3 writes flat tensors
                tensors = {file.stem: _tensor(loading.load(file, "DeepSpeed parameter-state"), shape)
                           for file in sorted((zero / name).glob("*.pt"))}
                model[name] = tensors.pop("fp32").detach()
                if "step" not in tensors and group_step is not None:
                    tensors["step"] = group_step
                state[name] = tensors
        groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": list(group_names)}
                  for group, group_names in zip(saved["param_groups"], names, strict=True)]
    return {"model": model, "optim": {"state": state, "param_groups": groups}}


def _tensor(loaded, shape: torch.Size) -> torch.Tensor:
    """A universal-checkpoint file's tensor in its parameter's shape (ZeRO 1-2 wrap it as ``{"param": tensor,
    "cat_dim": ...}``); a scalar (the step) stays one."""
    tensor = loaded["param"] if isinstance(loaded, dict) else loaded
    return tensor.reshape(shape) if tensor.dim() else tensor


def _deepspeed_parameter_shapes(folder: Path) -> list[dict[str, torch.Size]]:
    """Each optimizer group's parameters (name -> shape), in DeepSpeed's order, from a model-states file."""
    files = sorted(folder.glob("*model_states.pt"))
    if not files:
        raise CheckpointError(f"{folder} holds no DeepSpeed model states (*model_states.pt)")
    shapes = loading.load(files[0], "DeepSpeed model-state").get("param_shapes")
    if not shapes:
        raise CheckpointError(f"{files[0]} records no parameter shapes: not a ZeRO checkpoint DeepSpeed can regroup")
    return [dict(group) for group in shapes]
