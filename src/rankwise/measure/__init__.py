"""What rankwise measures and the yardsticks it measures against: throughput, FLOPs, memory, the
step-time breakdown and the equivalence tolerances.  Nothing in the library below the tools depends
on them but the loop's reporting."""
