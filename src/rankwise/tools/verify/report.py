"""The text of ``rankwise verify``'s report: the step table, the first difference, the diagnosis,
the verdict."""

from __future__ import annotations

import textwrap

from rankwise.measure.tolerance import UPDATE
from rankwise.tools.verify.hyperparameter_diff import changes_training, listed
from rankwise.tools.verify.records import StepLine, VerifyReport


def _number(value: float | None, form: str) -> str:
    return "—" if value is None else format(value, form)


def _dropout(report: VerifyReport) -> str:
    if not report["dropout"]["known"]:
        return "dropout: unknown (the one-process run ended before rt.prepare)"
    modules = report["dropout"]["modules"]
    if not modules:
        return "dropout: the model has no dropout module (random ops elsewhere are still detected)"
    listed = ", ".join(f"{m['module']}: {m['type']} p={m['p']:g}" for m in modules[:4]) + (
        f" and {len(modules) - 4} more" if len(modules) > 4 else ""
    )
    if report["dropout"]["kept"]:
        return f"dropout: kept in both runs (--keep-dropout): {listed}"
    return (
        f"dropout: switched off in both runs so random masks cannot hide the verdict ({listed}); "
        "--keep-dropout keeps it"
    )


CRITERION = (
    "criterion: the one process starts every step from the {n}-rank run's weights and steps with "
    "its gradient, so rounding never compounds; each step's gradient must match the one process's "
    "at those weights within {grad:.0e} (relative), its loss within {tol:.0e}, each tensor's "
    "update (its weights after the step less before it) the one process's update within "
    "{update:.0e} of that update's size (beyond one unit in the last place of the weight), and "
    "the optimizer's settings before the step (every group's hyper-parameters, every scheduler's "
    "state) exactly"
)


def step_table(report: VerifyReport) -> list[str]:
    ranks = f"loss ({report['processes']} ranks)" if report["processes"] > 1 else "loss (candidate)"
    out = [
        f"{'step':>4}  {'samples':<8} {'loss (1 process)':>17} {ranks:>17} {'|Δloss|':>9} "
        f"{'Δgradient':>10} {'Δupdate':>9} {'max |Δweight|':>14}"
    ]
    for line in report["step_lines"]:
        verdict = "same" if line["equivalent"] else "DIFFERENT"
        if not line["step"] and not line["params_ok"]:
            verdict = "differs as built (the one process took the N-rank run's: a warning below)"
        if line["step"] and not line.get("followed"):
            verdict += " (not in lockstep)"
        out.append(
            f"{line['step']:>4}  {line['data']:<8} {_number(line['loss_reference'], '.6g'):>17} "
            f"{_number(line['loss_candidate'], '.6g'):>17} {_number(line['loss_diff'], '.1e'):>9} "
            f"{_number(line.get('gradient_diff'), '.1e'):>10} "
            f"{_number(line.get('update_diff'), '.1e'):>9} {line['max_param_diff']:>14.1e}  "
            f"{verdict}"
        )
    return out


def evolution(report: VerifyReport) -> str | None:
    """The largest differences over the steps, in a line: rounding stays flat, a defect jumps."""
    lines = [
        line
        for line in report["step_lines"]
        if line["step"] and line.get("gradient_diff") is not None
    ]
    if len(lines) < 2:
        return None
    gradients = [gradient for line in lines if (gradient := line["gradient_diff"]) is not None]
    updates = [update for line in lines if (update := line.get("update_diff")) is not None]
    weights = [line["max_param_diff"] for line in lines]
    return (
        f"over steps {lines[0]['step']}-{lines[-1]['step']}: gradient difference "
        f"{min(gradients):.1e} .. {max(gradients):.1e} (last {gradients[-1]:.1e}), "
        + (
            f"update {min(updates):.1e} .. {max(updates):.1e} (last {updates[-1]:.1e}), "
            if updates
            else ""
        )
        + f"weights {min(weights):.1e} .. {max(weights):.1e} (last {weights[-1]:.1e})"
    )


def first_difference(
    first: StepLine,
    limit: float,
    gradient_limit: float,
    update_limit: float | None = None,
    processes: int = 2,
) -> list[str]:
    what = []
    settings = first.get("settings_diffs") or []
    if changes_training(settings):
        what.append(f"the optimizer's settings differ before it ({listed(settings, processes)})")
    if first["data"] == "differs":
        what.append(f"samples differ ({first['data_detail']})")
    if not first["loss_ok"]:
        what.append(f"loss differs by {first['loss_diff']:.1e}")
    if not first.get("gradient_ok", True):
        what.append(
            f"gradient differs by {first['gradient_diff']:.1e} relative (> {gradient_limit:.0e})"
        )
    update = first.get("update_diff")
    if update is not None and not first.get("update_ok", True):
        name = first["update_top"][0][0] if first.get("update_top") else "?"
        what.append(
            f"the update differs by {update:.1e} of itself (most in {name}"
            + (f"; > {update_limit:.0e})" if update_limit is not None else ")")
        )
    elif update is None and first["max_param_diff"] > limit:
        what.append(f"weights differ by {first['max_param_diff']:.1e} (> {limit:.0e})")
    if first["unmatched_tensors"]:
        what.append(f"tensors held by one run only: {', '.join(first['unmatched_tensors'][:5])}")
    out = [f"first difference: step {first['step']}: " + "; ".join(what or ["—"])]
    if not first.get("gradient_ok", True) and first.get("gradient_top"):
        out.append(
            "  gradients that differ most (each against the whole gradient): "
            + ", ".join(f"{name} {diff:.1e}" for name, diff in first["gradient_top"])
        )
    if first["top"] and first["max_param_diff"] > 0:
        out.append(
            "  weights that differ most: "
            + ", ".join(f"{name} {diff:.1e}" for name, diff in first["top"])
        )
    return out


def render(report: VerifyReport) -> str:
    processes = report["processes"]
    title = (
        f"verify: {report['strategy']} on {processes} process{'es' if processes > 1 else ''} "
        f"against one process, {report['precision'] or '32-true'}"
    )
    # nothing was compared: what failed, and why where it is known
    if report["verdict"] == "could not run":
        return "\n".join(
            [title, "", *_failures(report), *_diagnosis(report), "", VERDICTS["could not run"]]
        )
    out = [
        title,
        _dropout(report),
        *textwrap.wrap(
            CRITERION.format(
                n=processes,
                grad=report["gradient_tolerance"],
                tol=report["tolerance"],
                update=report.get("update_tolerance") or UPDATE,
            ),
            width=110,
        ),
    ]
    if report.get("framework"):
        out += textwrap.wrap(
            f"script: {report['framework']['name']}, started {report['framework']['launch']}; "
            f"{report['reference_made']}",
            width=110,
        )
    out.append("")
    out += _failures(report)
    if report["step_lines"]:
        out += step_table(report)
    if curve := evolution(report):
        out.append(curve)
    if first := report["first_difference"]:
        limit, gradient_limit = report["tolerance"], report["gradient_tolerance"]
        # a step was compared: under its tolerances
        assert limit is not None and gradient_limit is not None
        out += [""] + first_difference(
            first, limit, gradient_limit, report.get("update_tolerance"), processes
        )
    elif len(report["step_lines"]) <= 1 and not report["failure"]:
        out.append("no optimizer step was compared: does the script call rt.step?")
    if report.get("vacuous"):
        out += textwrap.wrap(
            f"nothing trained in the compared steps ({report['vacuous']}): their agreement proves "
            "nothing; give verify steps that train (a loss that depends on the weights, a learning "
            "rate above 0)",
            width=110,
        )
    out += _diagnosis(report)
    if report.get("ran"):
        out += ["", "what of the script ran (the distributed run):"] + [
            f"  {part}" for part in report["ran"]
        ]
    if report.get("checks"):
        out.append("checks that need no reference:")
        for check in report["checks"]:
            out += textwrap.wrap(
                check["check"]
                + (f": could not run — {check['not_run']}" if check["not_run"] else ": ran"),
                width=110,
                initial_indent="  ",
                subsequent_indent="     ",
            )
    if report.get("findings"):
        out += ["", "findings in the distributed run (need no reference):"]
        for finding in report["findings"]:
            out += textwrap.wrap(
                finding["text"],
                width=110,
                initial_indent=f"  {finding['level'].upper()}: ",
                subsequent_indent="     ",
            )
    steps = len(report["step_lines"]) - 1
    if report["step_lines"] and steps < report["steps_asked"]:
        out.append(
            f"compared {steps} of the {report['steps_asked']} steps asked (the runs recorded "
            f"{' and '.join(map(str, report['steps_reached']))})"
        )
    out += ["", verdict_line(report, steps)]
    return "\n".join(out)


def verdict_line(report: VerifyReport, steps: int) -> str:
    """The one verdict line, agreeing with the exit code: the comparison's verdict, unless a finding
    in the whole script changes its results (exit 1 then, whatever the compared steps showed)."""
    errors = sum(finding["level"] == "error" for finding in report.get("findings") or [])
    failed = any(finding["level"] == "failed" for finding in report.get("findings") or [])
    line = VERDICTS[report["verdict"]].format(steps=steps, incomparable=_incomparable(report))
    if failed and not errors and report["verdict"] in ("equivalent", "vacuous"):
        compared = (
            f"its {steps} compared steps match one process"
            if report["verdict"] == "equivalent"
            else "nothing trained in the compared steps"
        )
        return (
            f"verdict: the whole script could not be checked: {compared}, but the distributed run "
            "failed after them (exit 4)"
        )
    if not errors and report["verdict"] == "equivalent" and report.get("ran"):
        return (
            f"verdict: equivalent over {steps} compared steps, and nothing in the rest of the "
            "script changes what it computes or reports (exit 0)"
        )
    if not errors or report["verdict"] in ("not equivalent", "could not run"):
        return line
    compared = {
        "equivalent": f"its {steps} compared steps match one process, but",
        "vacuous": "nothing trained in the compared steps, and",
        "not comparable": "the steps are not comparable, and",
    }[report["verdict"]]
    findings = (
        f"{errors} finding{'s' if errors > 1 else ''} in the script "
        f"change{'s' if errors == 1 else ''}"
    )
    return (
        f"verdict: NOT equivalent as a whole: {compared} {findings} what it computes or reports "
        "(exit 1)"
    )


def _diagnosis(report: VerifyReport) -> list[str]:
    if not report["diagnosis"]:
        return []
    out = ["", "diagnosis (likeliest first):"]
    for number, finding in enumerate(report["diagnosis"], 1):
        out += textwrap.wrap(
            finding, width=110, initial_indent=f"  {number}. ", subsequent_indent="     "
        )
    return out


def _failures(report: VerifyReport) -> list[str]:
    out = []
    for name, error in report["failure"].items():
        who = "the one-process run" if name == "reference" else f"the {report['strategy']} run"
        first, *more = str(error).split("\n")  # (a stall: one line per rank, where it waited)
        out += textwrap.wrap(f"{who} failed: {first}", width=110, subsequent_indent="  ")
        for line in more:
            out += textwrap.wrap(line, width=110, initial_indent="  ", subsequent_indent="    ")
    return out


VERDICTS = {
    "equivalent": "verdict: equivalent over {steps} steps (exit 0)",
    "vacuous": "verdict: vacuous: nothing trained in the compared steps, so their agreement "
    "proves nothing (exit 5)",
    "not equivalent": "verdict: NOT equivalent (exit 1)",
    "could not run": "verdict: could not run: a run crashed, so nothing was compared (exit 4)",
    "not comparable": "verdict: not comparable: {incomparable} (exit 3)",
}


def _incomparable(report: VerifyReport) -> str:
    """Why the steps cannot be compared: the random ops, the script's own batches, or both."""
    kinds = {cause["kind"] for cause in report.get("causes") or []}
    why = [f"random ops in the forward ({_random_ops(report)})"] if "random" in kinds else []
    if "own-batches" in kinds:
        why.append("the script makes its own batches, and the one process's are not the ranks'")
    return "; ".join(why) or f"random ops in the forward ({_random_ops(report)})"


def _random_ops(report: VerifyReport) -> str:
    found = report.get("random_ops") or {}
    if not found:
        return "where: not located (a compiled forward, or outside the first step)"
    return ", ".join(sorted(found, key=lambda key: -found[key])[:3])
