"""Checkpoints: what a resume saves and loads, written the same way by every strategy.  Read top to
bottom:

1. :mod:`rankwise.checkpoint.resume` — ``rt.save_state`` / ``rt.load_state`` on every rank: who
   writes what, the order of the collectives, and how a checkpoint of any strategy and world size is
   taken back.  It sits above the strategies (it asks the registry whose format a checkpoint holds),
   so this package does not import it.
2. :mod:`rankwise.checkpoint.protocol` — the layout of a checkpoint, how it is staged, committed,
   verified and found again, and the RNG state it carries.
3. :mod:`rankwise.checkpoint.atomic_files` — files that are replaced whole or not at all;
   safetensors weights.
4. :mod:`rankwise.checkpoint.loading` — every ``.pt`` read weights-only.
5. :mod:`rankwise.checkpoint.convert` — the whole optimizer state keyed by index and by parameter
   name.
6. :mod:`rankwise.checkpoint.position` — where each ``rt.loader`` stands in its epoch.
7. :mod:`rankwise.checkpoint.deepspeed_format` — DeepSpeed's partitions read back whole and cut
   again.

Each strategy's own share is in its file: ``save_state``, ``load_state``, ``read_whole_state`` and
``claims`` in ``strategies/base.py``, FSDP's ``torch.distributed.checkpoint`` shards in
``strategies/fsdp.py``.
"""

from rankwise.checkpoint.atomic_files import (
    atomic_path,
    strip_module_prefix,
    write_text_atomic,
    write_weights,
)
from rankwise.checkpoint.protocol import (
    MANIFEST,
    STATE,
    WEIGHTS,
    begin_checkpoint,
    check_compatible,
    checked_write,
    commit_checkpoint,
    find_loadable,
    manifest_meta,
    read_weights,
    resolve,
    rng_state,
    set_rng_state,
    staging_dir,
    verify,
)
from rankwise.errors import CheckpointError, CollectiveSaveError

__all__ = [
    "MANIFEST",
    "STATE",
    "WEIGHTS",
    "CheckpointError",
    "CollectiveSaveError",
    "atomic_path",
    "begin_checkpoint",
    "check_compatible",
    "checked_write",
    "commit_checkpoint",
    "find_loadable",
    "manifest_meta",
    "read_weights",
    "resolve",
    "rng_state",
    "set_rng_state",
    "staging_dir",
    "strip_module_prefix",
    "verify",
    "write_text_atomic",
    "write_weights",
]
