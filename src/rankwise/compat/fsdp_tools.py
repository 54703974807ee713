"""torch: what ``rankwise plan`` measures FSDP2 with on fake ranks, from two private modules.

``FSDPMemTracker`` (``torch.distributed._tools.fsdp2_mem_tracker``) follows an FSDP2 step's memory
by kind (parameters, gradients, optimizer state, activations, buffers) on fake tensors;
``FakeStore`` (``torch.testing._internal.distributed.fake_pg``) lets a ``fake`` process group of N
ranks start in one process, so the shards are what N ranks hold.  Neither has a public home;
``tests/compat/test_private_apis.py`` resolves both on the installed torch, and the plan's FSDP
tests (``tests/tools/plan``) measure with them.
"""

from __future__ import annotations

from rankwise.compat.versions import Private

SEEN_ON = ("2.11", "2.13")

MEM_TRACKER = Private(
    "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker",
    "torch",
    "an FSDP2 step's memory by kind on fake tensors (the plan's FSDP rows)",
    SEEN_ON,
)
FAKE_STORE = Private(
    "torch.testing._internal.distributed.fake_pg.FakeStore",
    "torch",
    "the store of a 'fake' process group: N ranks' shards in one process",
    SEEN_ON,
)


def mem_tracker() -> type:
    """``FSDPMemTracker`` (imported when used: it imports FSDP's internals)."""
    MEM_TRACKER.check()
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    return FSDPMemTracker


def fake_store() -> type:
    """``FakeStore``."""
    FAKE_STORE.check()
    from torch.testing._internal.distributed.fake_pg import FakeStore

    return FakeStore
