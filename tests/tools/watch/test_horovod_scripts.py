"""`rankwise verify` and `bench --script` on a Horovod script in the source documents' pattern,
unchanged (tests/support/tools/watch/scripts/horovod_script.py: hvd.init, a DistributedSampler over
hvd.size(), broadcast_parameters/broadcast_optimizer_state, DistributedOptimizer), started as
`horovodrun -np 2 --gloo`."""

from __future__ import annotations

import pytest
from tests.support.tools.bench_rows import script_rows
from tests.tools.watch.test_verify_scripts import SCRIPTS, _verify

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

SCRIPT = "horovod_script.py"


def test_the_documents_horovod_script_is_not_equivalent_and_both_causes_are_named(tmp_path):
    """The documents found their Horovod model "did not really train": fp16 compression and a
    learning rate scaled by the world size, each named with the step it first shows in."""
    proc, report = _verify(tmp_path / "documented", SCRIPT, "--as-documented", steps=3)
    assert proc.returncode == 1 and report["verdict"] == "not equivalent", (
        proc.stdout + proc.stderr[-3000:]
    )
    causes = " ".join(report["diagnosis"])
    assert "Horovod's fp16 compression" in causes, causes
    assert "learning rate differs at step 1: one process 0.001, 2 ranks 0.002: 2x" in causes, causes
    # step 0 and 3 compared: Horovod's state-creating step is not counted
    assert len(report["step_lines"]) == 4
    # its evaluation, averaged with hvd.allreduce, is combined (before: "rank 0 evaluated 50 of
    # the 100 samples ... nothing was combined"); rank 0 alone prints its own loss
    texts = [(finding["kind"], finding["text"]) for finding in report["findings"]]
    assert not any("nothing was combined" in text for _, text in texts), texts
    assert any(kind == "per-rank-metric" for kind, _ in texts), texts


def test_bench_rows_by_world_size_with_lockstep_equivalence(tmp_path):
    rows = script_rows(SCRIPTS / SCRIPT, tmp_path)
    assert (
        rows["horovod x1"]["verdict"] == "reference"
        and rows["horovod x2"]["verdict"] == "equivalent"
    ), rows
    assert rows["horovod x2"]["samples_per_s"] and len(rows["horovod x2"]["peak_rss_mb"]) == 2
    assert len(rows["horovod x2"]["breakdown"]["ranks"]) == 2
