"""`rankwise verify` and `bench --script` on a DeepSpeed-engine script in the source documents'
pattern, unchanged (tests/support/tools/watch/scripts/deepspeed_engine.py: deepspeed.initialize with
a ZeRO config and gradient clipping, engine.backward, engine.step, a DistributedSampler,
engine.save_checkpoint); 2 ranks over gloo."""

from __future__ import annotations

import pytest
from tests.support.tools.bench_rows import script_rows
from tests.tools.watch.test_verify_scripts import SCRIPTS, _errors, _verify, _warnings

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

SCRIPT = "deepspeed_engine.py"


def test_an_unseeded_zero2_script_without_set_epoch_is_followed_step_by_step_and_its_defect_found(
    tmp_path,
):
    """Its engine's fp32 masters start from the N-rank run's weights, so each step matches one
    process although the two runs built different models; the missing set_epoch shows in its second
    epoch."""
    proc, report = _verify(tmp_path / "bad", SCRIPT, "--defective", "--unseeded", steps=None)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert report["verdict"] == "equivalent" and len(report["step_lines"]) == 6, proc.stdout
    assert all(
        line["max_param_diff"] <= report["tolerance"] for line in report["step_lines"][1:]
    ), report["step_lines"]
    assert any("set_epoch was never called" in text for text in _errors(report)), report["findings"]
    assert any(
        "two runs of this script start from different weights" in text for text in _warnings(report)
    )
    assert "deepspeed script" in proc.stdout and "ZeRO" not in report.get("failure", {})


def test_zero3_unseeded_bf16_is_followed_from_step_0_and_its_bf16_gradients_are_the_cause(tmp_path):
    """ZeRO-3's partitioned parameters are gathered, and the one process writes the N-rank run's
    weights into its own partition and fp32 master at every step (the weights match although the
    runs built different models); the bf16 config's gradients, reduced in bf16, are what differs,
    and the fix is in the DeepSpeed config.  Rank 0's print of its own loss is a per-rank metric
    (was missed: DeepSpeed back-propagates a scaled copy of the loss the script reads)."""
    proc, report = _verify(
        tmp_path / "zero3", SCRIPT, "--stage", "3", "--bf16", "--unseeded", steps=3
    )
    assert proc.returncode == 1 and report["verdict"] == "not equivalent", (
        proc.stdout + proc.stderr[-3000:]
    )
    assert all(
        line["max_param_diff"] <= report["tolerance"] for line in report["step_lines"][1:]
    ), report["step_lines"]
    assert any(
        "bfloat16" in cause and "DeepSpeed config" in cause for cause in report["diagnosis"]
    ), report
    assert any(
        "two runs of this script start from different weights" in text for text in _warnings(report)
    )
    # rank 0 reads its own loss for its print (engine.backward back-propagated a scaled copy: the
    # loss the script passed is the one watched)
    assert any(
        "rank 0 alone reads the training loss at .item() at deepspeed_engine.py:54" in text
        for text in _warnings(report)
    ), _warnings(report)


def test_bench_rows_by_world_size_with_lockstep_equivalence(tmp_path):
    rows = script_rows(SCRIPTS / SCRIPT, tmp_path)
    assert (
        rows["deepspeed x1"]["verdict"] == "reference"
        and rows["deepspeed x2"]["verdict"] == "equivalent"
    ), rows
    assert rows["deepspeed x2"]["samples_per_s"] and len(rows["deepspeed x2"]["peak_rss_mb"]) == 2
    assert len(rows["deepspeed x2"]["breakdown"]["ranks"]) == 2
