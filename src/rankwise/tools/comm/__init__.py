"""``rankwise comm``: the collective operations, demonstrated and verified (``demo``) and timed
(``bench``).

  ops.py       every operation the demo shows, each with its independently computed expected result
               and, where one exists, its equivalent composed from simpler operations
  demo.py      runs them on every rank and prints one ordered block per operation, pass or fail
  bench.py     times the bandwidth-bound collectives over a range of sizes, with a correctness check
  ceilings.py  what the machine allows: loopback TCP between two processes, single-thread memory
  copy report.py    the nccl-tests-style table, comm.json, comm.md and comm.png

The command line is :mod:`rankwise.cli.comm`; ranks start through
:func:`rankwise.tools.harness.run_on_ranks`.
"""
