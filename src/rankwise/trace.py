"""What the Runtime records step by step when ``rankwise verify`` asks where N ranks and one process part.

Switched on with the probe (:mod:`rankwise.probe`) and ``RANKWISE_PROBE_TRACE=1``.  For every
optimizer step each rank keeps:

* one digest per sample of every batch the script passes through ``rt.to_device`` while
  gradients are on (evaluation under ``no_grad`` is left out); padding is not part of a sample,
  so a sample padded to another batch's length keeps its digest;
* the tokens of each micro-batch, where the batch says it (``labels`` with -100, ``attention_mask``);
* every loss value given to ``rt.backward``;
* how many micro-batches drew random numbers between ``to_device`` and ``backward`` (the generator moved);
* in a one-process run, the trainable parameters that got no gradient;

and rank 0 writes the full fp32 weights after the step (``step-00000`` as prepared).  Dropout
modules are switched off (p=0) unless ``RANKWISE_PROBE_DROPOUT=keep``; the trace says which.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from rankwise.checkpoint import write_text_atomic, write_weights

TRACE, DROPOUT = "RANKWISE_PROBE_TRACE", "RANKWISE_PROBE_DROPOUT"
TRACE_FILE, FACTS_FILE = "trace.jsonl", "trace-facts.json"
PADDING = (0, -100)
"""Values trimmed from the end of a sample without an attention mask (pad id 0, ignored label -100)."""


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


def weights_file(directory: Path, step: int) -> Path:
    return Path(directory) / f"step-{step:05d}.safetensors"


def _tensors(batch) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for value in batch.values() for t in _tensors(value)]
    if isinstance(batch, (list, tuple)):
        return [t for value in batch for t in _tensors(value)]
    return []


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _row_bytes(row: torch.Tensor, keep: torch.Tensor | None) -> bytes:
    if keep is not None:
        row = row[keep]
    elif row.dim() and row.dtype in (torch.int64, torch.int32, torch.int16):
        padding = torch.isin(row.reshape(-1), torch.tensor(PADDING, dtype=row.dtype))
        real = (~padding).nonzero()
        row = row.reshape(-1)[: int(real[-1]) + 1 if len(real) else 0]
    return _raw_bytes(row)


def sample_digests(batch) -> list[str]:
    """One short digest per sample (row) of a batch: every tensor's row, padding left out."""
    tensors = [t.detach().cpu() for t in _tensors(batch) if t.dim() > 0]
    if not tensors:
        return []
    firsts = [t.shape[0] for t in tensors]
    rows = max(set(firsts), key=firsts.count)  # the batch dimension: the one most tensors share
    tensors = [t for t in tensors if t.shape[0] == rows]
    mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
    mask = mask.detach().cpu().bool() if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
    digests = []
    for i in range(rows):
        digest = hashlib.blake2b(digest_size=8)
        for t in tensors:
            keep = mask[i] if mask is not None and t.shape[:2] == mask.shape else None
            digest.update(str(t.dtype).encode() + _row_bytes(t[i], keep))
        digests.append(digest.hexdigest())
    return digests


def token_count(batch) -> int | None:
    """Tokens a loss averages over, where the batch says it: labels not -100, else the attention mask."""
    if not isinstance(batch, Mapping):
        return None
    labels, mask = batch.get("labels"), batch.get("attention_mask")
    if isinstance(labels, torch.Tensor) and labels.dim() > 1 and bool((labels == -100).any()):
        return int((labels != -100).sum())
    if isinstance(mask, torch.Tensor):
        return int(mask.sum())
    return None


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


def _digest_parameters(model: nn.Module) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for tensor in model.state_dict().values():
        if tensor.is_meta:  # not materialised yet (built on the meta device): nothing to compare
            continue
        digest.update(_raw_bytes(tensor))
    return digest.hexdigest()


class StepTrace:
    def __init__(self, directory: str | Path, keep_dropout: bool):
        self.directory, self.keep_dropout = Path(directory), keep_dropout
        self._state: list[torch.Tensor] | None = None
        self.facts: dict = {"dropout": [], "dropout_kept": keep_dropout, "half_params": [], "batch_dependent": [],
                            "ranks_built_same_weights": True}
        self._models = 0
        self._reset()

    def _reset(self) -> None:
        self.samples: list[str] = []
        self.tokens: list[int] = []
        self.losses: list[float] = []
        self.random_draws = 0
        self.no_grad: list[str] = []

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
                  "comm_hook": str(getattr(rt.strategy.options, "comm_hook", "none"))}
        first = self._models == 1
        if first:
            # Why: each rank built its own model; DDP starts from rank 0's copy, the sharding strategies from each
            # rank's own share, so ranks that built different weights are a finding of their own.
            facts["ranks_built_same_weights"] = len(set(rt.all_gather_object(_digest_parameters(model)))) == 1
        if rt.is_main:
            state = model.state_dict()
            if first and not any(t.is_meta for t in state.values()):
                write_weights({k: v.detach().float().cpu() for k, v in state.items()}, weights_file(self.directory, 0))
            write_text_atomic(self.directory / FACTS_FILE, json.dumps(facts, indent=2))

    def batch(self, batch, device: torch.device) -> None:
        if not torch.is_grad_enabled():
            return
        self.samples.extend(sample_digests(batch))
        tokens = token_count(batch)
        if tokens is not None:
            self.tokens.append(tokens)
        self._state = _generator_state(device)

    def backward(self, loss: torch.Tensor, device: torch.device) -> None:
        self.losses.append(float(loss.detach().float().sum()))
        if self._state is not None:
            now = _generator_state(device)
            self.random_draws += any(not torch.equal(a, b) for a, b in zip(self._state, now, strict=True))
            self._state = None

    def before_step(self, rt, model: nn.Module) -> None:
        if rt.world_size == 1:
            self.no_grad = [name.removeprefix("module.") for name, p in model.named_parameters()
                            if p.requires_grad and p.grad is None]

    def stepped(self, rt, model: nn.Module) -> None:
        """After optimizer step ``rt.steps`` (every rank): rank 0 appends every rank's record and the weights."""
        # Why: rank 0 writes what every rank saw in this step.
        records = rt.all_gather_object({"samples": self.samples, "tokens": self.tokens, "losses": self.losses,
                                        "random_draws": self.random_draws, "no_grad": self.no_grad})
        weights = rt.state_dict(model)  # a collective for sharded strategies
        if rt.is_main:
            write_weights({k: v.float() for k, v in weights.items()}, weights_file(self.directory, rt.steps))
            with open(self.directory / TRACE_FILE, "a", encoding="utf-8") as handle:
                handle.write(json.dumps({"step": rt.steps, "ranks": records}) + "\n")
        self._reset()
