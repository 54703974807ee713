"""Break a torch.distributed function inside a pooled test rank, and always put it back."""

from __future__ import annotations

import contextlib

import torch.distributed as torch_dist


@contextlib.contextmanager
def replaced(name: str | None, make):
    """``torch.distributed.<name>`` replaced by ``make(original)`` inside the block (nothing when
    ``name`` is None). Pooled ranks serve later tests, so torch is left as it was."""
    if not name:
        yield
        return
    original = getattr(torch_dist, name)
    setattr(torch_dist, name, make(original))
    try:
        yield
    finally:
        setattr(torch_dist, name, original)


def corrupting(rank: int, index: int):
    """A ``make`` for :func:`replaced`: the call's float tensor comes back off by one at ``index``
    on ``rank``."""

    def make(original):
        def corrupted(tensor, *args, **kwargs):
            done = original(tensor, *args, **kwargs)
            if torch_dist.get_rank() == rank and tensor.is_floating_point():
                tensor[index] += 1
            return done

        return corrupted

    return make
