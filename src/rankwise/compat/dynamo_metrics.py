"""torch: what Dynamo compiled, how long it took and why it compiled again (the private
``torch._dynamo.utils`` records).

Dynamo keeps process-wide records that its own ``torch._dynamo.utils.compile_times()`` and
``TORCH_LOGS=recompiles`` print from, and no public API returns: ``counters["frames"]["ok"]`` (the
graphs it compiled), ``compilation_time_metrics["_compile.compile_inner"]`` (each frame compile's
seconds, the forward and, with AOTAutograd, the backward graph it traces ahead) and
``guard_failures`` (for each compiled code object, the first guard that failed before each
recompile: ``"0/0: tensor 'args[0]' size mismatch at index 1. expected 128, actual 96"``).
:func:`snapshot` reads them; ``tests/compat/test_dynamo_metrics.py`` checks them on the installed
torch.
"""

from __future__ import annotations

from dataclasses import dataclass

SEEN_ON = ("2.13",)
"""torch release series it was checked on."""


@dataclass(frozen=True)
class CompileRecord:
    """Dynamo's records at one moment, process-wide; subtract two for what happened between."""

    graphs: int
    """Frames compiled into a graph."""
    seconds: float
    """Seconds spent compiling them."""
    failures: tuple[tuple[int, tuple[str, ...]], ...] = ()
    """Per compiled code object (by ``id``), the reasons it was compiled again."""

    @property
    def recompiles(self) -> list[str]:
        """Each recompile's reason: the guard of an earlier graph that failed."""
        return [reason for _, reasons in self.failures for reason in reasons]

    def __sub__(self, before: CompileRecord) -> CompileRecord:
        seen = dict(before.failures)
        return CompileRecord(
            self.graphs - before.graphs,
            self.seconds - before.seconds,
            tuple(
                (code, reasons[len(seen.get(code, ())) :])
                for code, reasons in self.failures
                if len(reasons) > len(seen.get(code, ()))
            ),
        )


def snapshot() -> CompileRecord:
    """Dynamo's records now (all zero where nothing was compiled, or Dynamo cannot be imported)."""
    try:
        from torch._dynamo import utils
    except ImportError:
        return CompileRecord(0, 0.0)
    return CompileRecord(
        int(utils.counters["frames"]["ok"]),
        float(sum(utils.compilation_time_metrics.get("_compile.compile_inner", []))),
        tuple(
            (id(code), tuple(str(reason) for reason in reasons))
            for code, reasons in utils.guard_failures.items()
        ),
    )
