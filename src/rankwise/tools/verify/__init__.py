"""``rankwise verify``: where a script's run on N ranks stops matching one process, step by step,
and why.

command.py   the two traced runs, the report files, the exit code
compare.py   the runs compared step by step (samples, loss, every tensor of the weights)
diagnose.py  the causes that fit what the runs recorded, likeliest first
report.py    the printed report
"""
