"""How much memory this process has needed: what benchmarks and run summaries report."""

from __future__ import annotations


def peak_rss_megabytes() -> float:
    """This process's peak resident memory so far, in MB.

    Linux's ``ru_maxrss`` carries the parent's peak across fork and exec, so a launched
    worker would report at least its launcher's memory; ``VmHWM`` belongs to this
    process's own address space.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)  # kB
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
