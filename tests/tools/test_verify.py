"""`rankwise verify`: a script on N ranks against one process, step by step; one small script per
way to differ.

Each case is a real `rankwise verify` (one process, then 2 ranks over gloo) of
tests/support/tools/verify_cases.py, whose --case switches on one thing that breaks equivalence.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from rankwise.sampling.samples import sample_digests, token_count
from rankwise.tools.verify.compare import TracedRun, compare_samples
from rankwise.tools.verify.diagnose import diagnose as diagnosed
from tests.support.cli import ROOT
from tests.support.tools.verify import CASES, loader_line


def diagnose(*args, **kwargs) -> list[str]:
    """The diagnosis's texts, gravest first."""
    return [cause["text"] for cause in diagnosed(*args, **kwargs)]


def _verify(
    out: Path, case: str, *flags: str, strategy: str = "ddp"
) -> tuple[SimpleNamespace, dict]:
    """`rankwise verify` in this process (its runs are fresh processes): its exit code, output and
    report."""
    from rankwise import cli

    out_text, err_text = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out_text), contextlib.redirect_stderr(err_text):
        code = cli.main(
            [
                "verify",
                str(CASES),
                "--strategy",
                strategy,
                "--steps",
                "2",
                "--out",
                str(out),
                *flags,
                "--",
                "--case",
                case,
            ]
        )
    report = json.loads((out / "verify.json").read_text()) if (out / "verify.json").exists() else {}
    return SimpleNamespace(
        returncode=code, stdout=out_text.getvalue(), stderr=err_text.getvalue()
    ), report


@pytest.mark.multiproc
def test_an_equivalent_script_passes_under_a_sharded_strategy_and_says_dropout_was_switched_off(
    tmp_path,
):
    proc, report = _verify(tmp_path / "ok", "ok", strategy="fsdp")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["equivalent"] is True and report["diagnosis"] == []
    assert [line["step"] for line in report["step_lines"]] == [0, 1, 2]
    assert all(
        line["data"] == "same" and line["max_param_diff"] <= 1e-5
        for line in report["step_lines"][1:]
    )
    assert (
        "dropout: switched off in both runs" in proc.stdout and "drop: Dropout p=0.3" in proc.stdout
    )
    assert (
        "verdict: equivalent over 2 compared steps, and nothing in the rest of the script changes"
        in proc.stdout
    )
    # the per-step weights are not kept
    assert not list((tmp_path / "ok").glob("*/step-*.safetensors"))
    # One probe for every script: the torch-level watcher ran both, following the script's Runtime,
    # and found nothing wrong with a correct script.
    assert report["framework"] == {
        "name": "rankwise",
        "launch": "as `rankwise launch --strategy fsdp` starts it",
    }
    assert sorted(
        path.name for path in (tmp_path / "ok" / "candidate").glob("watch-rank*.json")
    ) == ["watch-rank0.json", "watch-rank1.json"]
    assert report["findings"] == [] and "single" in report["reference_made"]


@pytest.mark.multiproc
def test_a_setup_script_stepping_with_plain_torch_calls_is_watched_and_equivalent(tmp_path):
    """loss.backward() and optimizer.step() in a script on rankwise.setup() (ddp allows them): the
    watcher sees those steps through torch's hooks; before, it listened to rt.step only and the runs
    'ended after 0 steps'."""
    proc, report = _verify(tmp_path / "plain", "plain-calls")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["equivalent"] is True and [line["step"] for line in report["step_lines"]] == [
        0,
        1,
        2,
    ]
    assert all(line["loss_ok"] and line["data"] == "same" for line in report["step_lines"][1:])


@pytest.mark.multiproc
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("batch-norm", ["BatchNorm1d", "SyncBatchNorm", "does not run on the CPU"]),
        ("micro-mean", ["not a mean over the global batch", "tokens per micro-batch in step 1"]),
        ("plain-loader", ["each of the 2 ranks saw the same 16 samples", "rt.loader(dataset"]),
        ("rank-seeded-sampler", ["step 1's samples differ", "rt.loader(dataset"]),
        ("half", ["bfloat16", "--precision bf16-mixed"]),
    ],
)
def test_each_way_to_differ_is_found_at_its_first_step_and_diagnosed(tmp_path, case, expected):
    proc, report = _verify(tmp_path / case, case, "--keep-weights")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert report["equivalent"] is False and report["first_difference"]["step"] == 1
    first_finding = report["diagnosis"][0]
    for words in expected:
        assert words in first_finding, (words, report["diagnosis"])
    assert (
        "first difference: step 1" in proc.stdout
        and "verdict: NOT equivalent (exit 1)" in proc.stdout
    )
    # --keep-weights: steps 0-2
    assert len(list((tmp_path / case).glob("candidate/step-*.safetensors"))) == 3
    if case == "batch-norm":  # the tensors that differ most are the statistics each rank kept alone
        assert report["first_difference"]["top"][0][0].startswith("norm.running_")


@pytest.mark.multiproc
def test_random_ops_rankwise_cannot_switch_off_make_the_runs_not_comparable_and_are_located(
    tmp_path,
):
    proc, report = _verify(tmp_path / "f", "functional-dropout")
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "not comparable" and report["equivalent"] is False
    assert report["random_ops"] and all(key.endswith(" in Net") for key in report["random_ops"])
    assert "not comparable: random ops in the forward (dropout in Net)" in proc.stdout
    assert "functional dropout" in report["diagnosis"][0]


@pytest.mark.multiproc
def test_compressed_gradients_are_named_as_the_compression_they_are(tmp_path):
    proc, report = _verify(tmp_path / "hook", "ok", "--set", "ddp.comm_hook=fp16_compress")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    first = report["first_difference"]
    assert (
        first["step"] == 1
        and not first["gradient_ok"]
        and first["data"] == "same"
        and first["loss_ok"]
    )
    # fp16's 11 bits, not a wrong gradient
    assert report["gradient_tolerance"] < first["gradient_diff"] < 1e-3
    assert "fp16_compress communication hook" in report["diagnosis"][0], report["diagnosis"]


@pytest.mark.multiproc
def test_a_parameter_without_gradient_fails_ddp_and_is_named(tmp_path):
    proc, report = _verify(tmp_path / "unused", "unused")
    assert proc.returncode == 4 and report["verdict"] == "could not run"  # the ddp run crashed
    assert "Expected to have finished reduction" in report["failure"]["candidate"]
    assert "spare.bias, spare.weight got no gradient" in report["diagnosis"][0]
    assert "--set ddp.find_unused_parameters=true" in report["diagnosis"][0]


# -- the pieces, without processes -----------------------------------------------------------------


def test_a_sample_keeps_its_digest_whatever_its_batch_pads_it_to():
    short = {
        "input_ids": torch.tensor([[5, 6, 7]]),
        "attention_mask": torch.tensor([[1, 1, 1]]),
        "labels": torch.tensor([1]),
    }
    padded = {
        "input_ids": torch.tensor([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]]),
        "labels": torch.tensor([1, 0]),
    }
    assert sample_digests(short)[0] == sample_digests(padded)[0] != sample_digests(padded)[1]
    assert sample_digests([torch.tensor([[1, 2, 0]]), torch.tensor([3])]) == sample_digests(
        [torch.tensor([[1, 2]]), torch.tensor([3])]
    )  # no mask: trailing pad ids are not the sample
    assert token_count({"labels": torch.tensor([[1, -100], [2, 3]])}) == 3
    assert (
        token_count({"attention_mask": torch.tensor([[1, 0], [1, 1]])}) == 3
        and token_count([torch.ones(2)]) is None
    )


def test_samples_are_compared_as_the_ranks_together_against_the_one_process():
    one = [{"samples": ["a", "b", "c", "d"]}]
    assert compare_samples(one, [{"samples": ["a", "c"]}, {"samples": ["b", "d"]}]) == ("same", "")
    each_all = compare_samples(one, [{"samples": ["a", "b", "c", "d"]}] * 2)
    assert each_all[0] == "differs" and each_all[1].startswith("each of the 2 ranks saw the same 4")
    assert compare_samples(one, [{"samples": ["a", "x"]}, {"samples": ["b", "y"]}]) == (
        "unmatched",
        "the 2 ranks saw 4 samples, 2 of them among the one process's 4",
    )  # a failure only with the loss
    assert (
        compare_samples(one, [{"samples": ["a", "b", "c"]}, {"samples": ["d", "e", "f"]}])[0]
        == "differs"
    )
    assert compare_samples([{"samples": []}], [{"samples": []}])[0] == "unseen"


def _run(
    steps: int = 1,
    draws: int = 0,
    losses: tuple = (0.5, 0.5),
    no_grad: tuple = (),
    lrs: tuple = (1e-3,),
    **facts,
) -> TracedRun:
    record = {
        "samples": ["a"],
        "tokens": [],
        "losses": list(losses),
        "random_draws": draws,
        "no_grad": list(no_grad),
        "learning_rates": list(lrs),
    }
    return TracedRun(
        Path("."), facts=facts, records={step: [record] for step in range(1, steps + 1)}
    )


FIRST = {
    "step": 1,
    "data": "same",
    "loss_ok": True,
    "top": [("w", 1.0)],
    "max_param_diff": 1.0,
    "loss_reference": 1.0,
    "loss_candidate": 1.0,
    "followed": True,
    "gradient_ok": True,
    "gradient_diff": 1e-7,
    "gradient_top": [("w", 1e-7)],
    "gradient_scale": 1.0,
    "gradient_only_one": [],
}
DIFFERENT_GRADIENT = FIRST | {
    "gradient_ok": False,
    "gradient_diff": 0.5,
    "gradient_top": [("w", 0.5)],
}


def test_kept_dropout_is_named_as_the_source_of_random_numbers():
    first = FIRST | {"loss_ok": False, "loss_candidate": 1.1}
    findings = diagnose(
        _run(draws=2, dropout_kept=True), _run(), [first], first, strategy="ddp", world_size=2
    )
    assert (
        "drew random numbers in 2 of 2 micro-batches" in findings[0]
        and "--keep-dropout" in findings[0]
    )
    # equivalent: nothing to say
    assert diagnose(_run(), _run(), [], None, strategy="ddp", world_size=2) == []


def test_weights_built_differently_are_a_reproducibility_warning_not_the_first_difference():
    """Before, step 0's difference (a model built unseeded) was the first difference and the only
    cause named."""
    from rankwise.tools.verify.compare import first_difference, start_differs

    start = {
        "step": 0,
        "params_ok": False,
        "equivalent": False,
        "top": [("head.weight", 0.36)],
        "max_param_diff": 0.36,
    }
    later = FIRST | {"equivalent": False, "followed": True}
    assert first_difference([start, later]) is later and first_difference([start]) is None
    warning = start_differs([start, later])
    assert warning.startswith(
        "two runs of this script start from different weights (head.weight differs by 3.6e-01"
    )
    assert "The reference started from the N-rank run's weights" in warning
    assert "could not start from the N-rank run's weights" in start_differs(
        [start, later | {"followed": False}]
    )
    assert start_differs([start | {"params_ok": True}, later]) is None


def test_every_cause_is_listed_with_the_step_it_first_shows_in():
    """A later step that differs for another reason adds its cause; the first step's causes come
    first."""
    scaled = DIFFERENT_GRADIENT | {"gradient_scale": 2.0, "equivalent": False}
    update = FIRST | {"step": 3, "equivalent": False, "followed": True}
    candidate = _run(steps=3)
    candidate.records[3] = [candidate.records[3][0] | {"learning_rates": [0.0]}]  # (from step 3 on)
    causes = diagnose(
        _run(steps=3), candidate, [scaled, update], scaled, strategy="ddp", world_size=2
    )
    assert (
        "summed over the ranks instead of averaged" in causes[0] and "(first shows" not in causes[0]
    )
    assert "another learning rate at step 3" in causes[1] and causes[1].endswith(
        "(first shows at step 3)"
    )
    assert len(causes) == 2


def test_a_learning_rate_scaled_by_the_world_size_is_a_cause_of_its_own_beside_the_gradients():
    """Horovod's examples scale the rate by hvd.size() and compress the gradients: both are
    named."""
    compressed = DIFFERENT_GRADIENT | {"gradient_diff": 3e-4, "equivalent": False}
    causes = diagnose(
        _run(),
        _run(lrs=(2e-3,), comm_hook="horovod_fp16_compression"),
        [compressed],
        compressed,
        strategy="ddp",
        world_size=2,
    )
    # (the graver first: a rate twice as large changes what is learnt, fp16 rounding by 1e-4)
    assert "Horovod's fp16 compression" in causes[1], causes
    assert "learning rate differs at step 1: one process 0.001, 2 ranks 0.002: 2x" in causes[0], (
        causes
    )


@pytest.mark.parametrize(
    ("reference", "candidate", "first", "failure", "words"),
    [
        (
            _run(),
            _run(),
            FIRST,
            None,
            "applied the same gradient (relative difference 1.0e-07), yet the 2 ranks'",
        ),
        (
            _run(),
            _run(lrs=(0.0,)),
            FIRST,
            None,
            "another learning rate at step 1: one process 0.001, 2 ranks 0",
        ),
        (
            _run(),
            _run(),
            FIRST | {"followed": False},
            None,
            "could not follow the N-rank run at this step",
        ),
        (
            _run(),
            _run(),
            DIFFERENT_GRADIENT,
            None,
            "something between the backward pass and the optimizer",
        ),
        (
            _run(),
            _run(),
            DIFFERENT_GRADIENT | {"gradient_scale": 2.0},
            None,
            "summed over the ranks instead of averaged",
        ),
        (
            _run(),
            _run(),
            DIFFERENT_GRADIENT | {"gradient_scale": 0.5},
            None,
            "averaged over the ranks twice",
        ),
        (
            _run(),
            _run(comm_hook="bf16_compress"),
            DIFFERENT_GRADIENT,
            None,
            "rounds every gradient to bf16",
        ),
        (
            _run(steps=4),
            _run(steps=2),
            None,
            None,
            "the 2-rank run recorded 2 optimizer steps, the one process 4",
        ),
        (
            _run(losses=()),
            _run(losses=()),
            FIRST | {"followed": False},
            None,
            "the loss was not recorded (the script does not call rt.backward",
        ),
        (_run(no_grad=("head.bias",)), _run(), None, "a timeout", "may wait for them"),
        (
            _run(no_grad=("head.bias",)),
            _run(),
            None,
            "RuntimeError: Expected to have finished reduction",
            "--set ddp.find_unused_parameters=true",
        ),
        (
            _run(),
            _run(batch_dependent=["InstanceNorm1d"], device="cuda"),
            FIRST,
            None,
            "convert_sync_batchnorm",
        ),
    ],
)
def test_each_finding_needs_its_evidence(reference, candidate, first, failure, words):
    findings = diagnose(
        reference,
        candidate,
        [first] if first else [],
        first,
        strategy="ddp",
        world_size=2,
        failure=failure,
        steps_asked=4,
    )
    assert words in findings[0], findings
    # no comm hook set: the diagnosis never blames compression
    if not candidate.facts.get("comm_hook"):
        assert not any("compress" in finding for finding in findings), findings
    # ddp keeps the optimizer whole: no sharded optimizer to blame
    assert not any("shards the optimizer state" in finding for finding in findings), findings


def test_only_a_strategy_that_shards_the_optimizer_is_told_its_sharded_step_differs():
    findings = diagnose(_run(), _run(), [FIRST], FIRST, strategy="fsdp", world_size=2)
    assert "fsdp shards the optimizer state" in findings[0]


def test_instance_norm_depends_on_the_batch_only_through_running_statistics():
    from torch import nn

    from rankwise.tools.step_trace import model_facts

    assert model_facts(nn.InstanceNorm1d(4))["batch_dependent"] == []
    assert model_facts(nn.InstanceNorm1d(4, track_running_stats=True))["batch_dependent"] == [
        "InstanceNorm1d"
    ]
    assert model_facts(nn.BatchNorm1d(4, track_running_stats=False))["batch_dependent"] == [
        "BatchNorm1d"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["S.py", "--strategy", "fsdp", "--steps", "3", "--", "--strategy", "x"],
        ["--strategy", "fsdp", "S.py", "--steps", "3", "--", "--strategy", "x"],
        ["--steps", "3", "S.py", "--strategy", "fsdp", "--", "--strategy", "x"],
    ],
)
def test_flags_go_before_or_after_the_script_and_the_scripts_own_after_the_double_dash(argv):
    from rankwise.cli import build_parser
    from rankwise.cli.verify import parse_rest

    args = parse_rest(build_parser().parse_args(["verify", *argv]))
    assert (args.script, args.strategy, args.steps, args.script_args) == (
        "S.py",
        "fsdp",
        3,
        ["--strategy", "x"],
    )


def test_help_after_the_script_is_the_commands_help(capsys):
    from rankwise.cli import build_parser
    from rankwise.cli.verify import parse_rest

    with pytest.raises(SystemExit) as stopped:
        parse_rest(build_parser().parse_args(["verify", "S.py", "--help"]))
    assert stopped.value.code == 0 and "--keep-dropout" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["missing.py", "--strategy", "ddp"], "missing.py: no such script"),
        (["tests/support/tools/verify_cases.py", "--strategy", "nope"], "--strategy: unknown"),
        (
            ["tests/support/tools/verify_cases.py", "--strategy", "horovod"],
            "not started by `rankwise launch`",
        ),
        (
            ["tests/support/tools/verify_cases.py", "--strategy", "ddp", "--nproc-per-node", "1"],
            "at least 2",
        ),
        (
            [
                "tests/support/tools/verify_cases.py",
                "--strategy",
                "ddp",
                "--set",
                "ddp.bucket_cap=1",
            ],
            "did you mean ddp.bucket_cap_mb",
        ),
        (["tests/support/tools/verify_cases.py"], "--strategy"),
    ],
)
def test_bad_flags_fail_before_anything_runs(argv, message, capsys, monkeypatch):
    from rankwise import cli

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(
        "rankwise.tools.verify.command.watched_runs", lambda *a, **k: pytest.fail("something ran")
    )
    try:
        code = cli.main(["verify", *argv])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err


@pytest.mark.multiproc
def test_a_run_that_crashed_could_not_run_exit_4_with_its_error_once(tmp_path):
    from rankwise import cli

    out, stdout, stderr = tmp_path / "crash", io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = cli.main(
            [
                "verify",
                str(CASES),
                "--strategy",
                "ddp",
                "--steps",
                "2",
                "--out",
                str(out),
                "--",
                # 15 does not split over 2 ranks
                "--batch-size",
                "15",
                "--grad-accum",
                "1",
            ]
        )
    output = stdout.getvalue() + stderr.getvalue()
    assert code == 4, output
    assert "verdict: could not run: a run crashed, so nothing was compared (exit 4)" in output
    assert (
        output.replace("\n  ", " ").count("batch_size=15 is not divisible by world_size (2)") == 1
    ), output
    assert "where:" in output and f"verify_cases.py, line {loader_line()}" in output.replace(
        "\n  ", " "
    )
    assert "NOT equivalent" not in output
    assert json.loads((out / "verify.json").read_text())["verdict"] == "could not run"


def test_replicas_that_never_average_come_before_batch_norm():
    """ImageNet's main.py under torchrun never wraps its model in DDP: the run's replicas differ
    (a finding of the run's own), and its BatchNorm2d is a cause too.  Before, the diagnosis named
    BatchNorm alone and the graver cause sat among the findings."""
    replicas = {"level": "error", "kind": "replicas", "text": "the ranks' replicas differ"}
    warning = {"level": "warning", "kind": "sync-point", "text": "a barrier every step"}
    causes = diagnosed(
        _run(),
        _run(batch_dependent=["BatchNorm2d"]),
        [FIRST],
        FIRST,
        strategy="ddp",
        world_size=2,
        framework="torch",
        run_findings=[warning, replicas],
    )
    assert [cause["kind"] for cause in causes] == ["replicas", "batch-dependent"], causes
    # an equivalent comparison leaves the run's findings where they are
    assert (
        diagnosed(_run(), _run(), [], None, strategy="ddp", world_size=2, run_findings=[replicas])
        == []
    )
