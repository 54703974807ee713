"""``rankwise verify`` on a script as its user wrote it (plain torch, Accelerate, Trainer, Fabric):
the watcher's runs.

The N-rank run starts as the script's framework would start it
(:mod:`rankwise.tools.watch.frameworks`) with the watcher in every rank
(:mod:`rankwise.tools.watch`).  The one-process reference runs the same script, unchanged, on one
process: each training ``DataLoader`` it builds takes N times its batch (a ``DistributedSampler``
there sees one replica), so its step t takes the samples the N ranks' step t took together; it
follows the N-rank run in lockstep as for scripts on ``rankwise.setup()``.  The two traces are then
compared and diagnosed by the same code (:mod:`rankwise.tools.verify.command`), and the N-rank run's
own record gives the findings that need no reference (:mod:`rankwise.tools.watch.findings`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from rankwise.tools.harness import crashed
from rankwise.tools.verify.records import ReportExtra
from rankwise.tools.watch.coverage import checks, parts_ran
from rankwise.tools.watch.findings import findings, load_records
from rankwise.tools.watch.frameworks import Framework
from rankwise.tools.watch.runs import watched_run
from rankwise.tools.watch.settings import WatchSettings
from rankwise.tools.watch.stall import STALL_TIMEOUT_S


def watched_runs(
    script: Path,
    script_args: list[str],
    framework: Framework,
    processes: int,
    out: Path,
    *,
    steps: int,
    keep_dropout: bool = False,
    timeout_s: float = 600.0,
    reference_args: list[str] | None = None,
    reference_framework: Framework | None = None,
    as_written: bool = False,
    log: Callable[[str], None] | None = None,
    stall_s: float = STALL_TIMEOUT_S,
    compared_only: bool = False,
) -> tuple[dict, ReportExtra]:
    """The two watched runs (the N-rank one first); returns their results and what the report adds:
    the framework, how the reference was made, the findings.  ``reference_framework``: how the one
    process starts, where not as the N ranks do (a script on ``rankwise.setup()``: under
    ``--strategy single``, whose Runtime gives one process the N ranks' global batches itself).
    After its ``steps`` the N-rank run goes on through the rest of the script, each later training
    pass cut short (``as_written``: whole; ``compared_only``: it stops there too, as the reference
    does, for a caller that needs only the compared steps' verdict); the reference stops there."""
    results, asked = {}, processes
    candidate_dir = (out / "candidate").resolve()
    for name, count, run_framework in (
        ("candidate", processes, framework),
        ("reference", 1, reference_framework or framework),
    ):
        run_dir = out / name
        shutil.rmtree(run_dir, ignore_errors=True)  # a trace appends: start it empty
        reference = name == "reference"
        own_args = reference_args if reference and reference_args is not None else script_args
        scaled = reference and reference_args is None and reference_framework is None
        settings = WatchSettings(
            run_dir,
            watched_steps=steps,
            keep_dropout=keep_dropout,
            follow=candidate_dir if reference else None,
            scale=processes if scaled else 1,
            after="stop"
            if reference or compared_only
            else "as-written"
            if as_written
            else "shorten",
            stall_s=stall_s,
        )
        results[name] = watched_run(
            script, own_args, run_framework, count, settings, timeout_s=timeout_s
        )
        started = results[name].get("spawn")
        if started:  # a script that starts its own ranks ran as many as it passes mp.spawn
            count = started["started"]
            processes = started["nprocs"] if not reference and started["nprocs"] > 1 else processes
        if log:
            what = (
                f"{run_framework.strategy}"
                if run_framework.launch_flags
                else f"{name}: {framework.name} script"
            )
            outcome = (
                "failed (why: below)"
                if crashed(results[name])
                else results[name].get("error", "ok")
            )
            log(f"{what} on {count} process(es): {results[name]['wall_s']} s, {outcome}")
    records = load_records(out / "candidate")
    found = findings(records, processes)
    reference_records = load_records(out / "reference")
    unscaled = sorted({note for record in reference_records for note in record.get("unscaled", [])})
    how = (
        "the one process ran the script with --reference-args"
        if reference_args is not None
        else f"the one process ran the script unchanged, {reference_framework.launch}: rankwise's "
        f"loaders give it the {processes} ranks' global batches"
        if reference_framework is not None
        else "the one process ran the script unchanged, each training DataLoader taking "
        f"{processes}x its batch and, batch by batch, the dataset indices the {processes} ranks "
        "took together"
    )
    if unscaled and reference_args is None:
        how += (
            "; not scaled (pass the script's own flag for the global batch with --reference-args): "
            + "; ".join(unscaled)
        )
    launch = framework.launch
    if framework.name == "spawn":
        launch, how = _spawned(script, results, asked, processes, how, reference_args is not None)
    extra: ReportExtra = {
        "framework": {"name": framework.name, "launch": launch},
        "reference_made": how,
        "findings": [finding.as_dict() for finding in found],
        "processes": processes,
        "ran": parts_ran(records[0]) if records else [],
        "checks": [{"check": check, "not_run": why} for check, why in checks(records, processes)]
        if records
        else [],
    }
    return results, extra


def _spawned(
    script: Path, results: dict, asked: int, processes: int, how: str, given: bool
) -> tuple[str, str]:
    """An mp.spawn script: how it started its ranks (what it passed, where its port came from), how
    its one-process reference was made, and where the reference could not be made that way, what to
    do."""
    candidate, reference = results["candidate"].get("spawn"), results["reference"].get("spawn")
    launch = f"as `python {script.name}` starts itself"
    if candidate:
        init = next((child["init"] for child in candidate["children"] if child["init"]), None)
        port = f", port {init['port']} {init['port_source']}" if init and init["port"] else ""
        launch += f": mp.spawn(nprocs={candidate['nprocs']}), its children the ranks{port}"
        if candidate["nprocs"] != asked:
            launch += (
                f" (the script sets its own world size: --nproc-per-node {asked} does not apply to "
                "it)"
            )
    if reference and not given:
        init = next((child["init"] for child in reference["children"] if child["init"]), None)
        samplers = [s for child in reference["children"] for s in child["samplers"]]
        changed = (
            [f"init_process_group at world size 1 (the script passed {init['world_size']})"]
            if init
            else []
        )
        if samplers:
            changed.append(
                "its DistributedSampler at 1 replica (the script passed "
                f"{samplers[0]['num_replicas']})"
            )
        how = how.replace(
            "the one process ran the script unchanged, ",
            f"the one process ran the script's own mp.spawn with nprocs=1, {', '.join(changed)}; ",
        )
    if crashed(results["reference"]) and not crashed(results["candidate"]) and not given:
        results["reference"]["error"] += (
            "\n(the reference ran the script's mp.spawn with nprocs=1 at world size 1, its "
            f"{processes} ranks' batches scaled into one: where the script cannot run so, give the "
            "one process's own arguments with --reference-args)"
        )
    return launch, how
