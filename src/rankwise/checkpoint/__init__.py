"""Checkpoints every strategy writes the same way: atomic files, a manifest of checksums written last.

* :mod:`rankwise.checkpoint.files` — files that are replaced whole or not at all; safetensors weights.
* :mod:`rankwise.checkpoint.protocol` — the layout of a checkpoint, how it is staged, committed,
  verified and found again, and the RNG state it carries.
"""

from rankwise.checkpoint.files import atomic_path, strip_module_prefix, write_text_atomic, write_weights
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

__all__ = ["MANIFEST", "STATE", "WEIGHTS", "CheckpointError", "CollectiveSaveError", "atomic_path",
           "begin_checkpoint", "check_compatible", "checked_write", "commit_checkpoint", "find_loadable",
           "manifest_meta", "read_weights", "resolve", "rng_state", "set_rng_state", "staging_dir",
           "strip_module_prefix", "verify", "write_text_atomic", "write_weights"]
