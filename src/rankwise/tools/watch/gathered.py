"""The rows a script cuts off what it gathered for an evaluation.

Accelerate's loaders give every rank the same number of batches (``even_batches``: the last one
repeats samples from the start), and ``accelerator.gather`` returns every rank's batch, repeats and
all.  ``gather_for_metrics`` drops the repeats; a script that calls ``gather`` drops them itself,
slicing the last gathered batch to what is left of the set (Accelerate's ``multi_process_metrics``
example: ``predictions[: len(eval_dataloader.dataset) - samples_seen]``).

Each tensor ``gather`` returns at several ranks is marked (:class:`Gathered`, a subclass that sees
its own indexing and hands plain tensors on), and a prefix slice of it counts the rows it cut.  Per
call, the most any of its tensors lost (predictions and references are cut alike): an evaluation's
repeats were dropped where those add up to them (``findings``' counted-more check).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from rankwise.compat.torch_function import DisableTorchFunctionSubclass
from rankwise.tools.watch.ranks import rank_and_world


class Gathered(torch.Tensor):
    """A tensor ``gather`` returned: its prefix slices are counted (:meth:`GatherWatch.cut`)."""

    _rankwise_call: int
    _rankwise_watch: GatherWatch

    @classmethod
    def __torch_function__(
        cls,
        func: Callable[..., Any],
        types: Collection[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        # (run as on a plain tensor: the result is one, and the marking goes no further)
        with DisableTorchFunctionSubclass():
            result = func(*args, **(kwargs or {}))
        if func is torch.Tensor.__getitem__ and isinstance(args[0], Gathered) and _prefix(args[1]):
            source = args[0]
            with DisableTorchFunctionSubclass():
                if source.dim() > 0 and isinstance(result, torch.Tensor) and result.dim() > 0:
                    source._rankwise_watch.cut(
                        source._rankwise_call, source.shape[0] - result.shape[0]
                    )
        return result


def _prefix(index: object) -> bool:
    """Whether ``index`` keeps the first rows along the first dimension (``[:n]``, ``[:n, :]``)."""
    if isinstance(index, tuple):
        index = index[0] if index else None
    return (
        isinstance(index, slice)
        and index.start in (None, 0)
        and index.step in (None, 1)
        and index.stop is not None
    )


class GatherWatch:
    def __init__(self) -> None:
        self.calls = 0
        self._cut: dict[int, int] = {}
        """Per ``gather`` call, the most rows one of its tensors lost to a prefix slice."""

    @property
    def trimmed(self) -> int:
        """Rows cut off gathered tensors so far (per call, its tensors' most)."""
        return sum(self._cut.values())

    def cut(self, call: int, rows: int) -> None:
        if rows > 0:
            self._cut[call] = max(self._cut.get(call, 0), rows)

    def patched(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``Accelerator.gather``, its tensors marked where several ranks gathered them."""
        watch = self

        def gather(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if rank_and_world()[1] < 2:
                return result
            watch.calls += 1
            return _marked(result, watch, watch.calls)

        return gather


def _marked(value: Any, watch: GatherWatch, call: int) -> Any:
    """What ``gather`` returned (the script's own structure: tensors in tuples, named tuples, lists,
    mappings), its plain tensors marked."""
    if isinstance(value, torch.Tensor) and not isinstance(value, Gathered):
        if type(value) is not torch.Tensor:  # (another subclass: left as it is)
            return value
        marked = value.as_subclass(Gathered)
        marked._rankwise_watch, marked._rankwise_call = watch, call
        return marked
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # (a named tuple)
        return type(value)(*(_marked(v, watch, call) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(_marked(v, watch, call) for v in value)
    if isinstance(value, Mapping):
        # ignore[call-arg]: the mapping's own class, from a dict (Mapping declares no __init__)
        return type(value)({k: _marked(v, watch, call) for k, v in value.items()})  # type: ignore[call-arg]
    return value
