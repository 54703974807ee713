"""The memory benchmark runs its strategies end to end (a tiny model, one step), with and without activation
checkpointing on long texts, and tabulates them."""

import json

from rankwise.tools.bench import memory


def test_memory_benchmark_tabulates_the_strategies_against_ddp_and_without_checkpointing(capsys):
    memory.main(["--model", "tiny", "--steps", "1", "--strategies", "ddp,fsdp",
                 "--activation-checkpointing", "--max-length", "64"])
    out = capsys.readouterr().out
    assert "failed" not in out, out
    result = json.loads(out.strip().splitlines()[-1])
    assert set(result["runs"]) == {"ddp", "ddp+ac", "fsdp", "fsdp+ac"}
    assert result["max_length"] == 64
    for label, row in result["runs"].items():
        assert row["world_size"] == 2 and len(row["peak_rss_mb"]) == 2, label
    assert "x DDP" in out and "without activation checkpointing" in out  # the ratio lines
