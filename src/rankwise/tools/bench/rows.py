"""The rows of ``rankwise bench``: every strategy as a user runs it, and loops that do not use
rankwise.

A row is either a rankwise run (``rankwise train --strategy NAME`` with a few settings: every
strategy with facts in the registry, and the rows its file adds) or a baseline from
:mod:`rankwise.tools.bench.baselines`.  Its equivalence tolerance is the one
:mod:`rankwise.measure.tolerance` states for its precision and gradient exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

from rankwise.measure.tolerance import tolerance
from rankwise.strategies import get_strategy, unavailable, with_facts
from rankwise.strategies.facts import Preset


@dataclass(frozen=True)
class Row:
    name: str
    strategy: str | None = None
    """A registered strategy or variant; None for a baseline."""
    settings: tuple[str, ...] = ()
    """``--set`` overrides of this row (precision, comm hook)."""
    baseline: str | None = None
    """A baseline loop style (``plain-ddp``, ...)."""
    about: str = ""
    threads: int | None = None
    """Threads per process when not the fair share of the cores (``single-1t``: one core's
    worth)."""
    preset: Preset = "quick"
    """The smallest preset whose default set holds the row: ``smoke`` (``make demo
    DEMO_PRESET=smoke``, CI's run of the demo: the reference, rankwise's two main strategies and
    the hand-written loop, each with its check), ``quick`` (``make demo``: one row per strategy
    and launcher), ``full`` (also the variants and the extra baselines), or ``opt-in`` (only when
    named)."""

    @property
    def smoke(self) -> bool:
        return self.preset == "smoke"

    @property
    def full_only(self) -> bool:
        return self.preset == "full"

    @property
    def opt_in(self) -> bool:
        return self.preset == "opt-in"

    @property
    def precision(self) -> str:
        return next(
            (s.split("=", 1)[1] for s in self.settings if s.startswith("precision=")), "32-true"
        )

    @property
    def comm_hook(self) -> str:
        return next(
            (s.split("=", 1)[1] for s in self.settings if s.startswith("ddp.comm_hook=")), "none"
        )

    @property
    def tolerance(self) -> float:
        return tolerance(self.precision, self.comm_hook)

    def processes(self, nproc: int) -> int:
        """Processes this row runs: one for one-process strategies (single, dp), else ``nproc``."""
        if self.baseline:
            return nproc
        assert self.strategy is not None  # a row is a baseline or a rankwise strategy
        return nproc if get_strategy(self.strategy).multiprocess else 1

    def missing(self) -> str | None:
        """Why this row cannot run here (a library not installed, with the install command), else
        None."""
        import importlib.util

        if self.baseline == "plain-accelerate" and importlib.util.find_spec("accelerate") is None:
            return "accelerate is not installed: pip install 'rankwise[accelerate]'"
        return unavailable(self.strategy) if self.strategy else None


BASELINES = [
    Row(
        "plain-ddp",
        baseline="plain-ddp",
        about="hand-written DDP loop, no rankwise",
        preset="smoke",
    ),
    Row(
        "plain-accelerate",
        baseline="plain-accelerate",
        about="Accelerate as its documentation shows it",
        preset="full",
    ),
    Row(
        "per-step-sync",
        baseline="per-step-sync",
        about="barrier + loss all-reduce + .item() every step",
        preset="full",
    ),
]
"""The loops that do not use rankwise."""


def all_rows() -> list[Row]:
    """Every row: each strategy the registry has facts for (its own file says where bench shows
    it, and the rows it adds: :mod:`rankwise.strategies.facts`), the least sharded first, then the
    baselines.  ``single`` leads: it is the reference of speedup and equivalence."""
    rows = []
    for variant in with_facts():
        facts = variant.facts
        assert facts is not None  # with_facts lists only these
        rows.append(Row(variant.name, variant.name, about=variant.about, preset=facts.bench))
        rows += [
            Row(
                variant.name + extra.suffix,
                variant.name,
                extra.settings,
                about=extra.about,
                threads=extra.threads,
                preset=extra.preset,
            )
            for extra in facts.bench_rows
        ]
    rows.sort(key=lambda row: row.strategy != "single")  # stable: the rest keep their order
    return rows + BASELINES


def select(names: list[str] | None, preset: str = "full") -> list[Row]:
    """The rows named (in the table's order), or the preset's default set; an unknown name is an
    error listing the known ones."""
    rows = all_rows()
    if not names and preset == "smoke":
        return [row for row in rows if row.smoke]
    if not names:
        return [row for row in rows if not row.opt_in and not (row.full_only and preset == "quick")]
    known = {row.name: row for row in rows}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"unknown bench row(s) {', '.join(unknown)}; choose from {', '.join(known)}"
        )
    chosen = [row for row in rows if row.name in names]
    if chosen[0].name != "single":
        chosen.insert(0, known["single"])  # the reference of speedup and equivalence
    return chosen
