"""The tools: measure and diagnose, on the library and the training app.

harness.py    node flags, run a function on N ranks and nodes, run `rankwise train` measured
machine.py    the machine and library versions every report records
doctor.py     is this machine (are these machines) ready for a distributed run?
comm/         the collective operations, demonstrated (`comm demo`) and timed (`comm bench`)
bench/        every strategy on one job: speed, memory, equivalence (`rankwise bench`)
"""
