"""The memory benchmark runs end to end (a tiny model, one step), with and without activation
checkpointing on long texts, and tabulates the runs."""

import json

import pytest

from rankwise.tools.bench import sharded_memory

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)


def test_memory_benchmark_tabulates_the_runs_with_and_without_checkpointing(capsys):
    # ddp alone: fsdp and ZeRO-3 run the same code path (and every strategy checkpoints layers in
    # tests/strategies/test_equivalence.py); each run here costs two fresh processes.
    sharded_memory.main(
        [
            "--model",
            "tiny",
            "--steps",
            "1",
            "--strategies",
            "ddp",
            "--activation-checkpointing",
            "--max-length",
            "64",
        ]
    )
    out = capsys.readouterr().out
    assert "failed" not in out, out
    result = json.loads(out.strip().splitlines()[-1])
    assert set(result["runs"]) == {"ddp", "ddp+ac"}
    assert result["max_length"] == 64
    for label, row in result["runs"].items():
        assert row["world_size"] == 2 and len(row["peak_rss_mb"]) == 2, label
    assert "ddp+ac: " in out and "MB without activation checkpointing" in out  # the comparison line
    assert "| ddp+ac | " in out
