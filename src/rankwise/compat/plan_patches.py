"""What ``rankwise plan`` replaces in torch while it runs a script up to its first training forward
as one rank of its job (``rankwise.tools.plan.own_world``): the job's start, and the wrappers that
would shard or synchronise the model the plan copies.  Each is a
:class:`~rankwise.compat.versions.Patch`, version-checked where it is made; every other module's
own reference to the same object (``from torch.nn.parallel import DistributedDataParallel``) is
replaced with it.  ``tests/compat/test_private_apis.py`` resolves each on the installed torch."""

from __future__ import annotations

from types import ModuleType

from rankwise.compat.versions import Patch

SEEN_ON = ("2.11", "2.13")

_WHY = {
    "torch.distributed.init_process_group": "the script's process group becomes a one-rank gloo "
    "group on a free port, whatever backend and address it asks for",
    "torch.distributed.distributed_c10d.init_process_group": "the same, where a library calls it "
    "by its module",
    "torch.multiprocessing.spawn": "mp.spawn runs the script's function once, as rank 0, in this "
    "process",
    "torch.nn.parallel.DistributedDataParallel": "DDP stands aside: the plan copies the module "
    "it wraps",
    "torch.nn.parallel.distributed.DistributedDataParallel": "the same, by its module",
    "torch.distributed.fsdp.FullyShardedDataParallel": "FSDP1 stands aside likewise",
    "torch.distributed.fsdp.fully_shard": "FSDP2 leaves the parameters whole, as at one rank, "
    "answering as sharded ones do (OneRankShards)",
}
PATCHES = {target: Patch(target, "torch", why, SEEN_ON) for target, why in _WHY.items()}
"""By target."""


def checked(owner: ModuleType, name: str) -> Patch:
    """The record of ``owner.name``, its version checked (a warning on a release not checked)."""
    record = PATCHES[f"{owner.__name__}.{name}"]
    record.check()
    return record
