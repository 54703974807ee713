"""A bench row's equivalence to one process: the criterion that applies to it, and the columns it
gives.

* ``lockstep``: ``rankwise verify``'s judgement (:mod:`rankwise.tools.verify.command`).  The row's
  strategy is traced for K steps with dropout modules switched off, and one process follows it in
  lockstep (the N-rank run's weights before each step, its gradient applied), so the timed runs need
  not switch anything off.  A ``bench --script`` row runs its script so; a built-in row runs the
  built-in app as a script on ``rankwise.setup()`` (:mod:`rankwise.tools.bench.app`) with the row's
  settings.
* ``weights``: a built-in row verify cannot run or cannot judge by its stated tolerance (a loop
  written without rankwise, a strategy started by another launcher than torchrun, a compressed
  gradient exchange, one process like ``single``).  It and ``single`` run K more steps each,
  untimed, with dropout 0, and the weights after them are compared against the row's stated
  tolerance (:mod:`rankwise.measure.tolerance`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rankwise.errors import ConfigError
from rankwise.launch.choice import Choice
from rankwise.strategies import lookup
from rankwise.tools.bench.records import EquivalenceColumns
from rankwise.tools.bench.rows import Row
from rankwise.tools.verify.command import outcome
from rankwise.tools.verify.records import VerifyReport

VERDICT_CELLS = {
    "equivalent": "pass",
    "not equivalent": "FAIL",
    "not comparable": "not comparable",
    "could not run": "could not run (verify)",
    "reference": "reference",
    "unchecked": "FAIL (unchecked)",
}
"""The table's equivalence cell for each verdict."""

UNDECIDED = ("not comparable", "could not run")
"""Verdicts that neither pass nor fail a row (a check that could not run makes the bench exit 4, not
1)."""


@dataclass(frozen=True)
class Criterion:
    kind: str
    """``reference`` (single), ``lockstep`` or ``weights``."""
    strategy: str | None = None
    """``lockstep``: the strategy ``rankwise verify`` runs."""
    note: str | None = None
    """Why this criterion (``weights``), or what ``lockstep`` ran instead of the row's own name."""


def criterion(row: Row, nproc: int) -> Criterion:
    """The criterion that judges ``row``, and why where it is not the lockstep one."""
    if row.name == "single":
        return Criterion("reference")
    if row.baseline:
        return Criterion(
            "weights",
            note="a loop written without rankwise: rankwise verify runs the built-in app, which "
            "this loop replaces",
        )
    if row.comm_hook != "none":
        return Criterion(
            "weights",
            note=f"ddp.comm_hook={row.comm_hook} compresses the gradient exchange, which rankwise "
            "verify names as a difference by design; the row's stated tolerance judges it instead",
        )
    assert row.strategy is not None  # not a baseline
    variant = lookup(row.strategy)
    if variant.strategy == "single":
        return Criterion(
            "weights",
            note="one process, as single: verify would compare single with itself; the weights "
            "show what this row changes (threads, compilation)",
        )
    launcher = variant.settings.get("launch.launcher") or variant.cls.launcher
    for name in dict.fromkeys([row.strategy, variant.strategy]):
        try:
            Choice(name).check_launch(row.processes(nproc))
        except (ConfigError, ValueError):
            continue
        return Criterion(
            "lockstep",
            name,
            None
            if name == row.strategy
            else f"verified as {name}: rankwise verify starts the ranks with torchrun, not "
            f"{launcher}; the training is the same",
        )
    return Criterion(
        "weights",
        note=f"{row.strategy} starts its ranks with {launcher}; rankwise verify starts them with "
        "torchrun",
    )


def verify_app(
    strategy: str,
    processes: int,
    data_dir: Path,
    settings: list[str],
    out: Path,
    *,
    steps: int,
    timeout_s: float,
) -> VerifyReport:
    """``rankwise verify`` of the built-in app under ``strategy`` with these ``--set`` overrides:
    its report (one that could not run, where verify itself failed: the timed rows' report
    stands)."""
    from rankwise.tools.bench import app
    from rankwise.tools.verify.command import verify_runs

    try:
        return verify_runs(
            Path(app.__file__),
            [str(data_dir), *settings],
            strategy,
            processes,
            out,
            steps=steps,
            timeout_s=timeout_s,
            # the compared steps are the check: the timed run shows the rest (its evaluation count,
            # its checkpoint), so the N ranks stop with the reference
            compared_only=True,
        )
    except Exception as e:  # noqa: BLE001 - the row's check could not run, said why
        return {
            "strategy": strategy,
            "processes": processes,
            "verdict": "could not run",
            "failure": {"verify": f"{type(e).__name__}: {e}"},
            "step_lines": [],
            "diagnosis": [],
            "findings": [],
            "dropout": {"modules": []},
            "tolerance": None,
            "gradient_tolerance": None,
        }


def lockstep_columns(report: VerifyReport) -> EquivalenceColumns:
    """A row's equivalence columns from ``rankwise verify``'s report of it."""
    lines = [line for line in report["step_lines"] if line["step"]]
    gradients = [gradient for line in lines if (gradient := line.get("gradient_diff")) is not None]
    dropout = report["dropout"]["modules"]
    reason = report["diagnosis"][0] if report["diagnosis"] else None
    # (verify's exit code's verdict: a finding that changes results fails the row as it fails
    # verify, whatever the compared steps showed)
    verdict = outcome(report)
    found = {finding["level"]: finding["text"] for finding in reversed(report.get("findings", []))}
    reason = reason or found.get("error")
    if verdict == "could not run":
        reason = "its verify run could not run: " + "; ".join(
            [*report.get("failure", {}).values(), *filter(None, [found.get("failed")])]
        )
    elif lines and all(line.get("data") == "unseen" for line in lines):
        verdict, reason = (
            "unchecked",
            (
                "no training batch came from a DataLoader, so nothing showed which samples each "
                "rank trained on: build the loader with rt.loader (or a DataLoader with a "
                "DistributedSampler)"
            ),
        )
    return {
        "equivalent": {"equivalent": True, "not equivalent": False}.get(verdict),
        "verdict": verdict,
        "compared_steps": len(lines),
        "compared": f"dropout off ({len(dropout)} modules)"
        if dropout
        else "as written (no dropout module)",
        "max_param_diff": max((line["max_param_diff"] for line in lines), default=None),
        "max_gradient_diff": max(gradients, default=None),
        "tolerance": report["tolerance"],
        "gradient_tolerance": report["gradient_tolerance"],
        "reason": reason,
    }


def weights_columns(
    difference: float | None, tolerance: float, steps: int, error: str | None = None
) -> EquivalenceColumns:
    """A row's equivalence columns from its weights after ``steps`` against ``single``'s (``None``:
    not compared, ``error`` says why)."""
    verdict = (
        "could not run"
        if difference is None
        else "equivalent"
        if difference <= tolerance
        else "not equivalent"
    )
    return {
        "equivalent": {"equivalent": True, "not equivalent": False}.get(verdict),
        "verdict": verdict,
        "compared_steps": steps,
        "compared": f"dropout 0 (separate {steps}-step runs)",
        "max_param_diff": difference,
        "max_gradient_diff": None,
        "tolerance": tolerance,
        "gradient_tolerance": None,
        "reason": error and f"its weight comparison could not run: {error}",
    }
