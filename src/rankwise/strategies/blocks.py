"""A model's repeated layers, and the two things done to them: sharding units and activation
checkpointing.

The repeated layers are the transformer blocks: the layers ``transformers`` itself can checkpoint
(they derive from its ``GradientCheckpointingLayer``: ``BertLayer``), else modules whose class the
model names in ``_no_split_modules``.  A model of your own opts in the same way, with a class
attribute ``_no_split_modules = ["Block"]``.  FSDP shards each layer as its own unit; activation
checkpointing keeps only each layer's inputs in the forward pass and recomputes the rest in the
backward pass (``torch.utils.checkpoint``, non-reentrant): less memory for about one more forward
pass.
"""

from __future__ import annotations

from torch import nn
from torch.utils.checkpoint import checkpoint

from rankwise.errors import ConfigError

# transformers' base class of its checkpointable layers
_CHECKPOINTABLE = "GradientCheckpointingLayer"


def _outermost(model: nn.Module, is_block) -> list[nn.Module]:
    found: list[nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():  # pre-order: a block comes before its children
        if id(module) in inside or module is model or not is_block(module):
            continue
        found.append(module)
        inside.update(id(child) for child in module.modules())
    return found


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's transformer layers, outermost only: the layers transformers marks checkpointable
    where it marks any (its ``_no_split_modules`` also names embeddings, which need neither), else
    the modules whose class the model (or a model inside it) names in ``_no_split_modules``."""
    marked = _outermost(
        model, lambda m: any(cls.__name__ == _CHECKPOINTABLE for cls in type(m).__mro__)
    )
    if marked:
        return marked
    names = {
        name
        for module in model.modules()
        for name in getattr(module, "_no_split_modules", None) or []
    }
    return _outermost(model, lambda m: type(m).__name__ in names)


_CHECKPOINTED: dict[type, type] = {}


def _checkpointed(cls: type) -> type:
    """``cls`` with a forward that recomputes its activations in the backward pass (one subclass per
    class).

    A subclass, not a ``forward`` stored on the instance: DataParallel's replicas copy a module's
    attributes, and a stored forward would stay bound to the original layer and its device."""
    if cls not in _CHECKPOINTED:

        def forward(self, *args, **kwargs):
            # Non-reentrant: works with keyword inputs, with inputs that need no gradient, under
            # FSDP's and ZeRO-3's parameter hooks and under torch.compile; the RNG state is
            # replayed, so dropout matches.
            return checkpoint(
                # (mypy cannot type the class the closure names: it is made below)
                super(checkpointed, self).forward,  # type: ignore[arg-type]
                *args,
                use_reentrant=False,
                **kwargs,
            )

        checkpointed = type(
            f"Checkpointed{cls.__name__}",
            (cls,),
            {"forward": forward, "__module__": cls.__module__},
        )
        _CHECKPOINTED[cls] = checkpointed
    return _CHECKPOINTED[cls]


def checkpoint_blocks(model: nn.Module) -> int:
    """Recompute each repeated layer's activations in the backward pass; returns how many layers.
    Each layer becomes an instance of a subclass of its class in place, so parameter names (and so
    checkpoints and exports) do not change."""
    layers = transformer_blocks(model)
    if not layers:
        raise ConfigError(
            f"activation checkpointing: {type(model).__name__} has no layers rankwise can find; "
            "name your block class in a class attribute _no_split_modules = ['Block'] on the model"
        )
    for layer in layers:
        if type(layer) not in _CHECKPOINTED.values():  # idempotent: prepare may be called again
            layer.__class__ = _checkpointed(type(layer))
    return len(layers)


def is_checkpointed(model: nn.Module) -> bool:
    """Whether :func:`checkpoint_blocks` already made some of the model's layers recompute their
    activations."""
    checkpointed = set(_CHECKPOINTED.values())
    return any(type(module) in checkpointed for module in model.modules())
