"""`rankwise verify` on scripts as users write them: plain DDP, FSDP2, Accelerate's quick tour,
Hugging Face Trainer, an mp.spawn script.

Every case is a real `rankwise verify` of a script in tests/support/tools/watch/scripts/ (2 ranks
over gloo, then one process following them), unchanged; each script has a correct and a defective
form.  Library defaults throughout (AdamW's own settings, dropout on as modules, Trainer's
TrainingArguments).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

SCRIPTS = Path(__file__).parents[2] / "support" / "tools" / "watch" / "scripts"


def _verify(
    out: Path, script: str, *script_args: str, flags: tuple[str, ...] = (), steps: int | None = 6
):
    """`rankwise verify SCRIPT` in this process (its runs are fresh processes): exit code, output,
    report. ``steps=None``: verify's default window."""
    from rankwise import cli

    out_text, err_text = io.StringIO(), io.StringIO()
    window = ("--steps", str(steps)) if steps is not None else ()
    with contextlib.redirect_stdout(out_text), contextlib.redirect_stderr(err_text):
        code = cli.main(
            [
                "verify",
                str(SCRIPTS / script),
                *window,
                "--out",
                str(out),
                *flags,
                "--",
                *script_args,
            ]
        )
    report = json.loads((out / "verify.json").read_text()) if (out / "verify.json").exists() else {}
    return SimpleNamespace(
        returncode=code, stdout=out_text.getvalue(), stderr=err_text.getvalue()
    ), report


def _line(script: str, text: str) -> int:
    """The number of the first line of ``script`` (in SCRIPTS) that holds ``text``."""
    lines = (SCRIPTS / script).read_text(encoding="utf-8").splitlines()
    return next(number for number, line in enumerate(lines, 1) if text in line)


def _errors(report: dict) -> list[str]:
    return [finding["text"] for finding in report["findings"] if finding["level"] == "error"]


def _warnings(report: dict) -> list[str]:
    return [finding["text"] for finding in report["findings"] if finding["level"] == "warning"]


def test_a_multi_epoch_ddp_script_is_checked_whole_and_its_later_defects_are_each_found(tmp_path):
    """The source documents' mistakes show only after the first epoch and after training; before,
    the default verify ended the script at step 5 and printed 'equivalent over 5 steps (exit 0)'."""
    proc, report = _verify(tmp_path / "bad", "ddp_epochs.py", "--defective", steps=None)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    # its 5 compared steps match
    assert report["verdict"] == "equivalent" and len(report["step_lines"]) == 6
    errors, warnings = _errors(report), _warnings(report)
    assert any(
        "set_epoch was never called: its 3 passes" in text
        and "Call sampler.set_epoch(epoch)" in text
        for text in errors
    ), errors
    assert any(
        "evaluation counted 80 predictions over the 2 ranks for a 40-sample set" in text
        for text in errors
    )
    save = f"ddp_epochs.py:{_line('ddp_epochs.py', 'torch.save(model.state_dict()')}"
    assert any("'module.'" in text and save in text for text in warnings), warnings
    assert any("2 ranks wrote one checkpoint file" in text for text in warnings), warnings
    barrier, all_reduce, item = (
        _line("ddp_epochs.py", call) for call in ("dist.barrier()", "dist.all_reduce(", ".item()")
    )
    assert any(
        text.startswith(f"barrier at ddp_epochs.py:{barrier} runs every step") for text in warnings
    ), warnings
    assert any(
        text.startswith(f"all_reduce at ddp_epochs.py:{all_reduce} runs every step")
        for text in warnings
    ), warnings
    assert any(
        text.startswith(f".item() at ddp_epochs.py:{item} runs every step")
        and "on a GPU each call waits" in text
        for text in warnings
    ), warnings
    # What ran: every epoch, shortened after the window; every evaluation whole; the save; the
    # script's own end.
    ran = "\n".join(report["ran"])
    assert (
        "training: loader 0, 3 passes of 20 batches; after the compared steps each was cut to 2 "
        "batches" in ran
    )
    assert "optimizer steps: 11 (5 compared with one process, 6 after them" in ran
    assert "evaluation: loader 1, 3 whole passes of 40 samples" in ran and save in ran
    assert "the script ran to its end, closing its process group itself" in ran
    assert all(check["not_run"] is None for check in report["checks"]), report["checks"]
    verdict = proc.stdout.strip().splitlines()[-1]
    assert verdict.startswith(
        "verdict: NOT equivalent as a whole: its 5 compared steps match one process, but 2 findings"
    ) and verdict.endswith("(exit 1)"), verdict
    assert "exit 0" not in proc.stdout

    proc, report = _verify(tmp_path / "ok", "ddp_epochs.py", steps=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "equivalent" and _errors(report) == []
    assert [line["data"] for line in report["step_lines"][1:]] == ["same"] * 5
    assert "dropout: switched off in both runs" in proc.stdout and "Dropout p=0.1" in proc.stdout
    assert "script: torch, started as torchrun would start it" in proc.stdout
    assert (
        proc.stdout.strip().splitlines()[-1].startswith("verdict: equivalent over 5 compared steps")
    )


def test_as_written_runs_the_rest_of_the_script_whole(tmp_path):
    proc, report = _verify(
        tmp_path / "whole", "ddp_epochs.py", "--epochs", "2", flags=("--as-written",), steps=2
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert (
        "training: loader 0, 2 passes of 20 batches" in report["ran"][0]
        and "cut" not in report["ran"][0]
    )
    assert "optimizer steps: 40 (2 compared with one process, 38 after them" in report["ran"][1]


def test_a_validation_on_rank_0s_shard_only_is_found_and_summing_the_counts_fixes_it(tmp_path):
    proc, report = _verify(tmp_path / "bad", "image_classifier.py", "--defective", steps=None)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    # training is right; the accuracy it prints is rank 0's half
    assert report["verdict"] == "equivalent"
    (error,) = _errors(report)
    assert (
        error.startswith("rank 0 evaluated 32 of the 64 samples of loader 1")
        and "nothing was combined" in error
    )
    proc, report = _verify(tmp_path / "ok", "image_classifier.py", steps=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _errors(report) == [] and report["verdict"] == "equivalent"
    assert any(
        "evaluation: loader 1, 3 whole passes of 64 samples" in part for part in report["ran"]
    )


def test_a_tutorial_script_that_trains_nothing_on_unseeded_data_says_so(tmp_path):
    """PyTorch's DDP tutorial style, as written: an unseeded model, data drawn per process without a
    seed and a loss that is identically zero. Before: 'NOT equivalent' because 'the runs start from
    different weights', samples 'unmatched' at every step with no word why, and nothing said that a
    comparison of zeros proves nothing."""
    proc, report = _verify(tmp_path / "bad", "tutorial_ddp.py", "--defective", steps=None)
    # the data differs per process: an error
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "vacuous"
    assert (
        "the loss was exactly 0 at every step" in report["vacuous"]
        and "every gradient was 0" in report["vacuous"]
    )
    assert proc.stdout.strip().splitlines()[-1] == (
        "verdict: NOT equivalent as a whole: nothing trained in the compared steps, and 1 finding "
        "in the script changes what it computes or reports (exit 1)"
    )
    assert not any("start from different weights" in cause for cause in report["diagnosis"])
    assert any(
        finding["level"] == "warning"
        and finding["text"].startswith("two runs of this script start from different weights")
        for finding in report["findings"]
    )
    (samples,) = [text for text in _errors(report) if "samples do not match" in text]
    assert (
        "the same dataset index gives different tensors" in samples and "MyTrainDataset" in samples
    )
    defined = next(
        number
        for number, line in enumerate((SCRIPTS / "tutorial_ddp.py").read_text().splitlines(), 1)
        if line.startswith("class MyTrainDataset")
    )
    built = next(
        number
        for number, line in enumerate((SCRIPTS / "tutorial_ddp.py").read_text().splitlines(), 1)
        if "loader = DataLoader(" in line
    )
    assert (
        f"(defined at tutorial_ddp.py:{defined}, its DataLoader built at tutorial_ddp.py:{built})"
        in samples
    )
    assert "without a seed" in samples
    # Seeded data and model, but the zero loss kept: nothing trained is its own verdict, exit 5.
    proc, report = _verify(tmp_path / "zero", "tutorial_ddp.py", "--zero-loss", steps=2)
    assert proc.returncode == 5 and report["findings"] == [], proc.stdout + proc.stderr[-3000:]
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .startswith("verdict: vacuous: nothing trained in the compared steps")
    )
    proc, report = _verify(tmp_path / "ok", "tutorial_ddp.py", steps=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "equivalent" and report["findings"] == []
    # A failure after the compared steps (its first snapshot, at the end of epoch 0): the comparison
    # stands, the rest of the script could not be checked (exit 4), and what ran before the failure
    # is still read.
    proc, report = _verify(tmp_path / "late", "tutorial_ddp.py", "--fail-at-save", steps=None)
    assert proc.returncode == 4, proc.stdout + proc.stderr[-3000:]
    assert (
        report["verdict"] == "equivalent"
        and len(report["step_lines"]) == 6
        and _errors(report) == []
    )
    (late,) = [finding["text"] for finding in report["findings"] if finding["level"] == "failed"]
    assert (
        late.startswith("after the 5 compared steps the distributed run failed")
        and "No space left" in late
    )
    assert (
        proc.stdout.strip()
        .splitlines()[-1]
        .startswith(
            "verdict: the whole script could not be checked: its 5 compared steps match one process"
        )
    )
    assert any(
        part.startswith("training: loader 0, 1 pass of 32 batches") for part in report["ran"]
    ), report["ran"]


def test_fsdp2_with_a_global_token_mean_is_equivalent_and_a_per_micro_batch_mean_is_not(tmp_path):
    proc, report = _verify(tmp_path / "ok", "plain_fsdp2.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "equivalent"
    assert all(line["gradient_diff"] < 1e-6 for line in report["step_lines"][1:])
    proc, report = _verify(tmp_path / "bad", "plain_fsdp2.py", "--per-micro-batch-mean", steps=2)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert report["first_difference"]["step"] == 1 and report["first_difference"]["data"] == "same"
    assert "not a mean over the global batch" in report["diagnosis"][0]
    assert "dist.all_reduce" in report["diagnosis"][0] and "rt." not in report["diagnosis"][0]


def test_accelerates_quick_tour_is_equivalent_and_batch_norm_is_diagnosed(tmp_path):
    proc, report = _verify(tmp_path / "ok", "accelerate_tour.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert (
        report["framework"]["name"] == "accelerate"
        and "ACCELERATE_USE_CPU=true" in report["framework"]["launch"]
    )
    assert report["verdict"] == "equivalent" and report["findings"] == []
    proc, report = _verify(tmp_path / "bn", "accelerate_tour.py", "--batch-norm", steps=2)
    assert proc.returncode == 1 and report["first_difference"]["step"] == 1
    assert "BatchNorm1d" in report["diagnosis"][0]


def test_accelerates_scheduler_stepped_per_process_is_caught_at_lr_2e_5_and_its_fix_passes(
    tmp_path,
):
    """Accelerate's nlp_example at its stock lr 2e-5: the warm-up runs twice as fast on 2 ranks.
    Before, the weights' difference (~1e-7) stayed under the absolute 1e-5 and verify said
    equivalent (exit 0)."""
    proc, report = _verify(tmp_path / "as-written", "accelerate_schedule.py", steps=3)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert report["framework"]["name"] == "accelerate" and report["verdict"] == "not equivalent"
    first = report["first_difference"]
    assert first["step"] == 2 and first["max_param_diff"] < report["tolerance"]
    assert first["update_diff"] > 0.5 and not first["settings_ok"]
    assert {"scheduler", "learning-rate"} <= {d["kind"] for d in first["settings_diffs"]}
    assert report["causes"][0]["kind"] == "scheduler", report["causes"]
    cause = report["causes"][0]["text"]
    assert cause.startswith("the learning-rate scheduler did not step as in one process"), cause
    assert "group 0 lr: one process 2e-07, 2 ranks 4e-07" in cause
    assert "Accelerate's AcceleratedScheduler steps the scheduler it wraps num_processes" in cause
    assert "Accelerator(step_scheduler_with_optimizer=False)" in proc.stdout
    # the documented fix: the warm-up counted in per-process batches (the scheduler still steps
    # twice per optimizer step, over twice the steps: the same rates)
    proc, report = _verify(tmp_path / "fixed", "accelerate_schedule.py", "--fix", "counts", steps=3)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "equivalent" and report["diagnosis"] == []
    assert all(line["update_diff"] == 0.0 for line in report["step_lines"][1:]), report[
        "step_lines"
    ]


def test_an_accelerate_script_started_without_its_cpu_mode_is_found_training_alone(tmp_path):
    proc, report = _verify(
        tmp_path / "alone", "accelerate_tour.py", flags=("--framework", "torch"), steps=2
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    # (the gravest cause of the steps that differ: ranked first in the diagnosis, said once)
    causes = {cause["kind"]: cause["text"] for cause in report["causes"]}
    assert (
        "2 of the 2 processes never joined a process group (Accelerate's num_processes 1)"
        in causes["not-joined"]
    ), report["causes"]
    assert report["causes"][0]["kind"] == "not-joined"
    errors = _errors(report)
    assert any("every one of the 2 ranks trained on the same samples" in text for text in errors), (
        errors
    )
    assert report["verdict"] == "not equivalent"
    assert "each of the 2 ranks saw the same 8 samples" in report["first_difference"]["data_detail"]


def test_trainers_default_loss_scaling_is_caught_behind_an_unseeded_model_and_its_setting_fixes_it(
    tmp_path,
):
    """Before, a model built before any seed made the report name only 'the runs start from
    different weights' (step 0), hiding the loss scaled by the world size at every step."""
    proc, report = _verify(tmp_path / "default", "hf_trainer.py", "--unseeded", steps=None)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert report["framework"]["name"] == "trainer" and report["verdict"] == "not equivalent"
    first = report["first_difference"]
    assert (
        first["step"] == 1
        and first["data"] == "same"
        and first["loss_candidate"] == pytest.approx(2 * first["loss_reference"], rel=1e-5)
    )
    # doubled, then capped by Trainer's max_grad_norm=1.0
    assert 1.05 < first["gradient_scale"] <= 2.0
    assert "average_tokens_across_devices" in report["diagnosis"][0], report["diagnosis"]
    assert not any("different weights" in cause for cause in report["diagnosis"])
    assert any(
        finding["text"].startswith("two runs of this script start from different weights")
        and "The reference started from the N-rank run's weights" in finding["text"]
        for finding in report["findings"]
        if finding["level"] == "warning"
    ), report["findings"]
    proc, report = _verify(tmp_path / "fixed", "hf_trainer.py", "--no-average-tokens", steps=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "equivalent"


def test_a_lightning_fabric_loop_is_equivalent_and_batch_norm_is_flagged(tmp_path):
    proc, report = _verify(tmp_path / "ok", "fabric_loop.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["framework"]["name"] == "fabric" and report["verdict"] == "equivalent"
    # fabric.print shows rank 0's line only: the loss of its shard (a warning: before, unseen)
    (printed,) = [f["text"] for f in report["findings"] if f["kind"] == "per-rank-metric"]
    assert "rank 0 alone prints the training loss (fabric.print at fabric_loop.py:" in printed
    assert [line["data"] for line in report["step_lines"][1:]] == ["same"] * 6
    proc, report = _verify(tmp_path / "bn", "fabric_loop.py", "--batch-norm", steps=2)
    assert proc.returncode == 1 and "BatchNorm1d" in report["diagnosis"][0]


def test_a_lightning_trainer_script_is_named_so_and_its_padded_validation_is_found(tmp_path):
    """Before: reported as 'a fabric script, started as `fabric run --devices N`', and its
    validation (251 samples counted as 252) never reached in 5 steps."""
    pytest.importorskip(
        "lightning.pytorch",
        reason="lightning is an optional test dependency (pip install lightning)",
    )
    proc, report = _verify(
        tmp_path / "padded", "lightning_trainer.py", "--log-val-loss", steps=None
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert (
        report["framework"]["name"] == "lightning" and "fabric" not in report["framework"]["launch"]
    )
    assert (
        report["verdict"] == "equivalent"
        and [line["data"] for line in report["step_lines"][1:]] == ["same"] * 5
    )
    # Lightning steps with a closure (the forward and backward run inside optimizer.step): each
    # step's gradient is still compared in lockstep (before: none, every parameter "no gradient")
    assert all(line["gradient_diff"] is not None for line in report["step_lines"][1:]), report[
        "step_lines"
    ]
    errors = {f["kind"]: f["text"] for f in report["findings"] if f["level"] == "error"}
    assert sorted(errors) == ["counted-more", "per-rank-metric"], errors
    assert (
        "evaluation counted 252 predictions over the 2 ranks for a 251-sample set"
        in errors["counted-more"]
        and "pads 1" in errors["counted-more"]
    )
    # Before, "evaluation was counted exactly once" and the per-rank val_loss went unseen
    assert "self.log('val_loss', ...)" in errors["per-rank-metric"]
    assert "without sync_dist=True" in errors["per-rank-metric"]
    assert any(
        part.startswith("evaluation: loader 0, 1 whole pass of 251 samples")
        for part in report["ran"]
    )
    proc, report = _verify(tmp_path / "even", "lightning_trainer.py", "--even", steps=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert _errors(report) == [] and report["verdict"] == "equivalent"


def test_metrics_a_rank_reports_from_its_own_shard_are_found(tmp_path):
    """Rank 0 prints its own loss every step; a torchmetrics mean never syncs.  Before, neither was
    found and the run was equivalent (exit 0)."""
    proc, report = _verify(tmp_path / "metrics", "plain_ddp.py", "--per-rank-metrics", steps=3)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "equivalent"
    found = [(f["level"], f["kind"], f["text"]) for f in report["findings"]]
    (metric,) = [
        text for level, kind, text in found if kind == "per-rank-metric" and level == "error"
    ]
    assert "MeanMetric" in metric and "sync_on_compute=False" in metric
    (loss,) = [
        text for level, kind, text in found if kind == "per-rank-metric" and level == "warning"
    ]
    assert "rank 0 alone reads the training loss at .item() at plain_ddp.py:" in loss, loss


def test_a_batching_the_reference_cannot_scale_is_named_and_reference_args_fix_it(tmp_path):
    proc, report = _verify(tmp_path / "unscaled", "plain_ddp.py", "--batch-sampler")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert (
        "not scaled" in report["reference_made"]
        and "its own batch_sampler" in report["reference_made"]
    )
    # the reference's first pass runs twice as many batches
    assert report["first_difference"]["step"] == 5
    proc, report = _verify(
        tmp_path / "given",
        "plain_ddp.py",
        "--batch-sampler",
        flags=("--reference-args=--batch-sampler --batch-size 16",),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "equivalent" and "--reference-args" in report["reference_made"]


def test_more_steps_than_the_script_trains_says_how_many_it_ran(tmp_path):
    from rankwise.tools.watch.frameworks import framework
    from rankwise.tools.watch.runs import watched_run
    from rankwise.tools.watch.settings import WatchSettings

    result = watched_run(
        SCRIPTS / "plain_ddp.py",
        ["--epochs", "1"],
        framework("torch"),
        2,
        WatchSettings(tmp_path / "run", watched_steps=6, trace=False),
        timeout_s=120,
    )
    assert (
        result["ended_early"]
        and "the script ended after 4 optimizer steps, before the 6 asked" in result["error"]
    )


def test_a_rank_that_stops_making_progress_is_stopped_and_the_report_says_where_each_rank_waited(
    tmp_path,
):
    started = time.monotonic()
    proc, report = _verify(tmp_path / "stall", "stalls.py", flags=("--stall-timeout", "8"), steps=5)
    wall = time.monotonic() - started
    shown = proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 4 and report["verdict"] == "could not run", shown
    assert wall < 90, shown  # each run ends seconds after its deadline, not at --timeout (600 s)
    failure = report["failure"]["candidate"]
    assert "made no progress for 8 s and was stopped" in failure, shown
    # Rank 0 sleeps at line 17; rank 1 waits for it in DDP's all-reduce, inside loss.backward() at
    # line 20.  Which deadline fires first is a race: the other rank is then stopped by torchrun,
    # and says where it waited too.
    assert re.search(
        r"rank 0 (made no progress for 8 s and was stopped|was stopped by its launcher meanwhile); "
        r"it waited at stalls\.py:17 in <module>",
        failure,
    ), shown
    rank_1 = r"rank 1 .*; it waited at stalls\.py:20 in <module> \(torch/"
    assert "rank 1" not in failure or re.search(rank_1, failure), shown
    alone = report["failure"]["reference"]  # the one process sleeps at the same step
    assert "rank 0 made no progress for 8 s and was stopped; it waited at stalls.py:17" in alone, (
        shown
    )
    assert "the torch script run failed: rank " in proc.stdout, shown


def test_an_mp_spawn_script_starts_as_it_starts_itself_and_a_missing_set_epoch_is_found(
    tmp_path, monkeypatch
):
    from rankwise.launch.ports import free_port

    port = free_port()
    # the script's fixed port, one per test run side by side
    monkeypatch.setenv("SPAWN_PORT", str(port))
    proc, report = _verify(tmp_path / "ok", "spawn_ddp.py", steps=None)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert (
        report["verdict"] == "equivalent"
        and report["framework"]["name"] == "spawn"
        and report["processes"] == 2
    )
    # (the tutorial's own idiom, a finding all the same: rank 0 prints its shard's loss)
    assert [(f["level"], f["kind"]) for f in report["findings"]] == [
        ("warning", "per-rank-metric")
    ], report["findings"]
    assert (
        "rank 0 alone reads the training loss at .item() at spawn_ddp.py:"
        in (report["findings"][0]["text"])
    )
    # epoch 2 begins at step 4
    assert [line["data"] for line in report["step_lines"][1:]] == ["same"] * 5
    assert (
        "as `python spawn_ddp.py` starts itself: mp.spawn(nprocs=2), its children the ranks, "
        f"port {port} set "
        "in the script" == report["framework"]["launch"]
    )
    assert report["reference_made"].startswith(
        "the one process ran the script's own mp.spawn with nprocs=1, init_process_group at world "
        "size 1 (the script passed 2), its DistributedSampler at 1 replica (the script passed 2); "
        "each training DataLoader taking 2x"
    )
    # The ranks wrote their records; the process that spawned them (rank 0 by its environment) none
    # of its own.
    assert sorted(
        path.name for path in (tmp_path / "ok" / "candidate").glob("watch-rank*.json")
    ) == ["watch-rank0.json", "watch-rank1.json"]
    proc, report = _verify(tmp_path / "bad", "spawn_ddp.py", "--defective", steps=None)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert any(
        "set_epoch was never called" in text and "2 passes" in text for text in _errors(report)
    ), report


def test_a_rank_that_hangs_at_exit_is_ended_and_reported_and_the_comparison_stands(
    tmp_path, monkeypatch
):
    """The exit guard under verify: rank 1's interpreter waits for a thread that never ends; its
    launcher ends it after RANKWISE_EXIT_GRACE_S (what `launch --exit-grace` sets) and verify's
    verdict still reads the whole run."""
    from rankwise import cli

    monkeypatch.setenv("RANKWISE_EXIT_GRACE_S", "3")
    script = Path(__file__).parents[2] / "support" / "launch" / "exit_hang.py"
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(
            [
                "verify",
                str(script),
                "--steps",
                "2",
                "--out",
                str(tmp_path / "run"),
                "--",
                str(tmp_path),
                "--hang",
                "thread",
                "--ranks",
                "1",
            ]
        )
    report = json.loads((tmp_path / "run" / "verify.json").read_text())
    assert code == 0 and report["verdict"] == "equivalent", out.getvalue()
    hung = [text for text in _warnings(report) if "hung at exit" in text]
    assert len(hung) == 1 and hung[0].startswith("in the distributed run, rank 1 (host"), (
        out.getvalue()
    )
    assert "ended after 3 s" in hung[0] and "for thread 'never-ends'" in hung[0]
