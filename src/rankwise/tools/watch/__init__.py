"""The probe for every training script, unchanged: it watches torch itself (and, in a script on
``rankwise.setup()``, the Runtime's steps: :mod:`rankwise.tools.watch.runtime`).

:mod:`rankwise.tools.watch.bootstrap` starts a rank: it installs the
:class:`~rankwise.tools.watch.watcher.Watcher` (hooks on torch's optimizers, DataLoaders, samplers,
autograd, collectives and ``torch.save``), runs the script as ``__main__`` and tears the process
group down after it.  The watcher writes the step-by-step trace ``rankwise verify`` compares
(:mod:`rankwise.tools.step_trace`) and one record per rank that :mod:`rankwise.tools.watch.findings`
reads for the mistakes that need no reference run. :mod:`rankwise.tools.watch.frameworks` says how
each framework's scripts start.
"""
