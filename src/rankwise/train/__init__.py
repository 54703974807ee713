"""The built-in training app: ``rankwise train``, ``predict`` and ``export``, written on the library
alone.

  config.py      the run configuration: typed, validated, one docstring per field
  preflight.py   everything refusable before a worker starts
  run.py         check, prepare the data once, launch the workers, report
  worker.py      what each rank runs: load the run directory, train, evaluate
  loop.py        the training loop on the public Runtime API
  optim.py       optimizer and learning-rate schedule
  metrics.py     metrics.jsonl and TensorBoard
  evaluate.py    sharded evaluation, each sample counted exactly once, and the report
  predict.py     classify texts with a checkpoint
  artifacts.py   what a checkpoint carries for predict/export, and the export file
  rundir.py      the run directory's layout
  preemption.py  SIGTERM / SIGINT become a stop at a step boundary every rank agrees on, or at the
                 end of a grace where none comes
  compiling.py   what compile=true cost: graphs, compile seconds, each recompile named

The datasets and models it trains live beside it in :mod:`rankwise.data` and :mod:`rankwise.models`.
"""
