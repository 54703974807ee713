"""The memory benchmark runs its three strategies end to end (a tiny model, one step) and tabulates them."""

import json

from rankwise.tools.bench import memory


def test_memory_benchmark_tabulates_the_strategies_against_ddp(capsys):
    memory.main(["--model", "tiny", "--steps", "1", "--strategies", "ddp,deepspeed-zero3"])  # fsdp: the same path
    out = capsys.readouterr().out
    assert "failed" not in out, out
    result = json.loads(out.strip().splitlines()[-1])
    assert set(result["runs"]) == {"ddp", "deepspeed-zero3"}
    for label, row in result["runs"].items():
        assert row["world_size"] == 2 and len(row["peak_rss_mb"]) == 2, label
    assert "x DDP" in out  # the ratio lines
