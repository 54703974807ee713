"""``rankwise plan``: one rank's memory and step time per strategy and world size, before having the
hardware.

capture (the script's first training step, parameters fake) -> trace (the step replayed on fake
tensors, memory by kind over time, FLOPs) -> memory (a formula per strategy over the trace; FSDP
measured on fake ranks) -> comms and timing (what each strategy communicates, how long, what
computation hides) -> planner (every strategy and world size, what fits, the cheapest change) ->
report, plot; validate and probe check it against real runs here.
"""
