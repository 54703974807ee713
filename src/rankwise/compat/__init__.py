"""Every workaround rankwise carries for another library, in one place: one function each, with the
upstream issue, the releases it was seen on and a version check
(:class:`rankwise.compat.versions.Workaround`): applied only before the release that fixes it, with
one warning on a release it was not checked on.  ``tests/compat`` holds a test per workaround that
fails when the upstream behaviour changes, so that the workaround can go.

* :mod:`~rankwise.compat.torch_compile` — compile through a frame Dynamo traces (pytorch#150915).
* :mod:`~rankwise.compat.torch_elastic` — a store key space per torchrun restart; a rendezvous that
  publishes rank 0's address every round.
* :mod:`~rankwise.compat.deepspeed_zero` — alias ZeRO-3's fp32 masters, skip the CPU shared-memory
  kernel build, clip for one step, pad the last ZeRO-3 partition.
* :mod:`~rankwise.compat.accelerate_state` — reset Accelerate's process-wide state.

Besides the workarounds, :mod:`~rankwise.compat.watch_patches` records every attribute of torch and
the frameworks that the watcher (``rankwise.tools.watch``) replaces to watch a script unchanged,
each a :class:`~rankwise.compat.versions.Patch` with the releases it was checked on and the same
kind of version check.
"""
