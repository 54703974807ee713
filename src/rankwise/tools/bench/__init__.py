"""``rankwise bench``: every strategy on one job, timed, its memory and its equivalence to one
process.

  rows.py       the rows (strategies, variants, baselines) and their stated tolerances suite.py
  the plan, the runs (alternating repeats), the checks, the command's work equivalence.py  which
  criterion judges a row (verify's lockstep, or weights), and the columns it gives app.py        the
  built-in app as a script on rankwise.setup(), for verify to run baselines.py  loops written
  without rankwise, for the overhead ratio report.py     table, reading, report.md/json/png
  memory.py     peak memory per rank of the sharded strategies against DDP (python -m) sentiment.py
  accuracy of the default job against a TF-IDF baseline (python -m)

Benchmarks print numbers; nothing here is a test.
"""
