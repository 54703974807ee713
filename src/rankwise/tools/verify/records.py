"""``rankwise verify``'s records: its report (``verify.json``, what ``rankwise bench`` judges a row
by), the step record in it (one line per optimizer step both traced runs reached, as
:func:`rankwise.tools.verify.compare.compare` writes it; the diagnosis, the report's table and
``rankwise bench``'s equivalence columns read it), and a rank's line of a step in the trace.  JSON
is the wire format; tuples come back as lists."""

from __future__ import annotations

from typing import Any, TypedDict

from typing_extensions import NotRequired

from rankwise.tools.watch.records import DropoutModule, FindingRecord


class GradientDifference(TypedDict):
    """One step's gradient of the N-rank run against one process's at the same weights
    (:func:`rankwise.measure.tolerance.gradient_difference`)."""

    difference: float
    """The relative norm of the difference, ``|g_N - g_1| / |g_1|`` (0 where both are 0, inf where
    only one is)."""
    top: list[tuple[str, float]]
    """The parameters that differ most, relatively: (name, relative difference)."""
    scale: float | None
    """``<g_N, g_1> / |g_1|^2``: the N-rank gradient's size in units of one process's (1: the same;
    N: summed, not averaged), None where one process's is 0."""
    only_one: list[str]
    """Parameters only one of the runs gave a (non-zero) gradient."""


class SettingDifference(TypedDict):
    """One setting that differs between the runs before a step."""

    where: str
    """``group 0``, or ``scheduler 0 (LambdaLR)``."""
    key: str
    """The group's key or the scheduler's ``state_dict`` key (``groups``, ``schedulers``: their
    count)."""
    one: Any
    """The one process's value (``None``: it has none)."""
    many: Any
    """The N-rank run's (rank 0's)."""
    kind: str
    """``scheduler``, ``learning-rate`` or ``hyperparameters``."""


class UpdateDifference(TypedDict):
    """One step's update of the weights on N ranks against one process's
    (:func:`rankwise.measure.tolerance.update_difference`)."""

    difference: float
    """The largest tensor's ``|Δ_N - Δ_1| / |Δ_1|`` (beyond one ulp of its weights)."""
    top: list[tuple[str, float]]
    """The tensors whose update differs most: (name, relative difference)."""
    whole: float
    """The same over every tensor together."""
    moved: bool
    """Whether one process's step moved any weight."""


class StepLine(TypedDict):
    """One optimizer step compared (step 0: the weights as prepared)."""

    step: int
    """The optimizer step after which the weights are compared (0: as built)."""
    max_param_diff: float
    """The largest absolute difference of any weight after the step."""
    top: list[tuple[str, float]]
    """The tensors that differ most: (name, largest absolute difference)."""
    unmatched_tensors: list[str]
    """Tensors only one run has, or whose shapes differ."""
    data: str
    """The step's samples, the N ranks together against the one process: ``same``, ``differs``,
    ``unmatched``, ``made`` (the script's own batches, not the one process's), ``unseen`` (no
    DataLoader batch, no inputs recorded), or ``—`` (step 0)."""
    data_detail: str
    """What differs about the samples, in words ("" where they are the same)."""
    loss_reference: float | None
    """The one process's loss at the step (the sum of its micro-batch losses); None where it gave
    none."""
    loss_candidate: float | None
    """The N-rank loss: the mean over ranks of each rank's summed micro-batch losses."""
    loss_diff: float | None
    """``|loss_reference - loss_candidate|`` (None where either is missing)."""
    followed: bool
    """Whether the one process started this step from the N-rank weights and applied the N-rank
    gradient."""
    gradient_diff: float | None
    """:attr:`GradientDifference.difference` (None: no gradient compared at this step)."""
    gradient_top: list[tuple[str, float]]
    """:attr:`GradientDifference.top`."""
    gradient_scale: float | None
    """:attr:`GradientDifference.scale`."""
    gradient_only_one: list[str]
    """:attr:`GradientDifference.only_one`."""
    update_diff: NotRequired[float | None]
    """How far the N-rank update is from one process's, relatively
    (:attr:`UpdateDifference.difference`; the whole update's where the step was not in lockstep);
    None at step 0."""
    update_top: NotRequired[list[tuple[str, float]]]
    """:attr:`UpdateDifference.top`."""
    settings_diffs: NotRequired[list[SettingDifference]]
    """The optimizer's settings that differ before the step (exactly compared)."""
    update_ok: NotRequired[bool]
    """The update agrees within the update tolerance (step 0: the weights within the tolerance)."""
    settings_ok: NotRequired[bool]
    """No setting that changes what the optimizer does differs (a scheduler's position alone does
    not: :func:`rankwise.tools.verify.hyperparameter_diff.changes_training`)."""
    loss_ok: NotRequired[bool]
    """The losses agree within the tolerance (relative above 1), or one is missing."""
    params_ok: NotRequired[bool]
    """The weights after the step agree — step 0 (as built) within the tolerance, a step its update
    within the update tolerance — and no tensor is unmatched."""
    gradient_ok: NotRequired[bool]
    """The gradients agree within the gradient tolerance (or none was compared) and none exists in
    one run alone."""
    equivalent: NotRequired[bool]
    """Update, settings, loss and gradient agree and the samples do not differ."""


class TracedStep(TypedDict):
    """One rank's line of one step in ``trace.jsonl``, as the watcher writes it (its
    :class:`~rankwise.tools.step_trace.StepRecord`, whose docstrings say more, and the weights'
    digest) and :class:`~rankwise.tools.verify.compare.TracedRun` reads it back."""

    samples: list[str]
    """One digest per sample the step trained on."""
    tokens: list[int]
    """Each micro-batch's tokens, where the batch says it."""
    inputs: NotRequired[list[str]]
    """Where no DataLoader batch was consumed: one digest per row of the model's training inputs
    (absent in a trace from before they were recorded)."""
    losses: list[float]
    """Every loss given to backward."""
    random_draws: int
    """Micro-batches whose forward moved the random generator."""
    random_ops: dict[str, int]
    """Random operations located in the forward (``"op in module"``: count)."""
    no_grad: list[str]
    """In a one-process run: trainable parameters without a gradient."""
    gradient: GradientDifference | None
    """In a following run: its gradient against the N-rank one."""
    followed: bool
    """Whether this step started from the N-rank weights and applied the N-rank gradient."""
    learning_rates: list[float | None]
    """Each parameter group's learning rate at the step."""
    hyperparameters: NotRequired[list[dict[str, Any]]]
    """Each parameter group's scalar settings before the step (absent in a trace from before they
    were recorded)."""
    schedulers: NotRequired[list[dict[str, Any]]]
    """Each learning-rate scheduler's state before the step (its class as ``scheduler``)."""
    weights_digest: str
    """A digest of the rank's weights after the step (replicas that differ are a finding)."""


class FrameworkRun(TypedDict):
    """How a script not on ``rankwise.setup()`` was started."""

    name: str
    """The framework (``torch``, ``accelerate``, ``lightning``, ``spawn``, ...)."""
    launch: str
    """How its ranks were started, in words."""


class Check(TypedDict):
    """One check of the findings that need no reference."""

    check: str
    """The check, in words."""
    not_run: str | None
    """Why it could not run (None: it ran, over what ``check`` says)."""


class DropoutSummary(TypedDict):
    """The dropout modules of the traced runs' models."""

    modules: list[DropoutModule]
    """Every dropout module with p > 0 (the reference's)."""
    known: NotRequired[bool]
    """Whether the reference recorded its facts at all."""
    kept: NotRequired[bool]
    """Whether they kept their p (``--keep-dropout``) rather than being set to 0."""


class ReportExtra(TypedDict, total=False):
    """What the watched runs add to a report
    (:func:`rankwise.tools.verify.watched.watched_runs`)."""

    framework: FrameworkRun
    """How the script was started."""
    reference_made: str
    """How the one-process reference was made, in words."""
    findings: list[FindingRecord]
    """The findings that need no reference (the distributed run's own)."""
    processes: int
    """The distributed run's process count (the comparison's; the watched runs', where a script
    started its own ranks)."""
    ran: list[str]
    """The parts of the script the run reached, in words."""
    checks: list[Check]
    """Each check of the findings, and why it could not run."""


class CauseRecord(TypedDict):
    """One cause of a difference (:func:`rankwise.tools.verify.diagnose.diagnose`)."""

    kind: str
    """What it is, as a word a program can match (docs/how-to/verify.md, "What verify names")."""
    text: str
    """What the runs showed and what to change, in words."""


class VerifyReport(ReportExtra):
    """``rankwise verify``'s report (``verify.json``; ``--json`` prints a part of it)."""

    strategy: str
    """The strategy checked, or ``<framework> script``."""
    tolerance: float | None
    """The weights' tolerance for the precision the distributed run ran (None: the check could not
    run)."""
    gradient_tolerance: float | None
    """The gradients' tolerance (relative)."""
    update_tolerance: NotRequired[float | None]
    """The updates' tolerance (relative, per tensor)."""
    precision: NotRequired[str | None]
    """The precision the distributed run ran, where rankwise or DeepSpeed said it."""
    comm_hook: NotRequired[str]
    """DDP's gradient communication hook."""
    step_lines: list[StepLine]
    """One line per step both runs reached (step 0: the weights as prepared): the comparison step
    by step."""
    steps_asked: NotRequired[int]
    """The steps the comparison asked for."""
    steps_reached: NotRequired[list[int]]
    """The steps each run recorded: the reference's, the distributed run's."""
    first_difference: NotRequired[StepLine | None]
    """The first optimizer step that differs."""
    diagnosis: list[str]
    """Why the runs differ, where the evidence says (one cause a line, gravest first)."""
    causes: NotRequired[list[CauseRecord]]
    """The same causes with their kinds."""
    failure: dict[str, str]
    """A run that crashed: its name (``candidate``, ``reference``, ``verify``) and its error."""
    random_ops: NotRequired[dict[str, int]]
    """The random operations the reference's forward ran, located."""
    dropout: DropoutSummary
    """The models' dropout modules."""
    verdict: str
    """``equivalent``, ``not equivalent``, ``not comparable``, ``vacuous`` or ``could not run``."""
    equivalent: NotRequired[bool]
    """Whether the verdict is ``equivalent``."""
    vacuous: NotRequired[str | None]
    """Why the compared steps prove nothing (nothing trained), else None."""
    comparison_findings: NotRequired[list[FindingRecord]]
    """The comparison's own findings (merged into ``findings`` before the report is written)."""
    meta: NotRequired[dict[str, Any]]
    """The command's arguments (script, its arguments, steps, precision, settings)."""
    exit_code: NotRequired[int]
    outcome: NotRequired[str]
    """The verdict the exit code states (a finding in the rest of the script can fail an
    equivalent comparison): what ``rankwise bench`` prints for the row."""
    """The command's exit code."""
    verdict_line: NotRequired[str]
    """The report's last line."""
