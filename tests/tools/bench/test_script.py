"""`rankwise bench --script`: a user's script, unchanged, under each strategy; real runs, honest verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rankwise.probe import model_facts
from rankwise.tools.bench.script import explain

ROOT = Path(__file__).parents[3]


def _bench(out: Path, script: str, strategies: str, *script_args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rankwise.cli", "bench", "--script", str(ROOT / "examples" / script),
                           "--strategies", strategies, "--steps", "4", "--out", str(out), "--json", "--",
                           *script_args], capture_output=True, text=True, timeout=600, cwd=out.parent)


def test_an_own_script_gets_every_column_and_is_equivalent_under_every_strategy(tmp_path):
    out = tmp_path / "lm"
    # deepspeed-zero2 on an own script: tests/examples/test_own_scripts.py
    proc = _bench(out, "causal_lm.py", "ddp,fsdp", "--samples", "128", "--batch-size", "16", "--lr", "1e-3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line["row"]: line for line in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]}
    assert list(rows) == ["single", "ddp", "fsdp"]
    for name, line in rows.items():
        assert line["status"] == "ok", (name, line["status"])
        assert line["processes"] == (1 if name == "single" else 2)
        assert line["samples_per_s"] > 0 and line["speedup"] > 0 and len(line["peak_rss_mb"]) == line["processes"]
        assert line["equivalent"] is True and line["max_param_diff"] <= line["tolerance"], (name, line)
    saved = json.loads((out / "report.json").read_text())
    assert [line["row"] for line in saved["rows"]] == list(rows)
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| fsdp | 2 |" in (out / "report.md").read_text()


def test_batch_norm_under_ddp_is_not_equivalent_and_the_row_says_why(tmp_path):
    proc = _bench(tmp_path / "cnn", "image_cnn.py", "ddp", "--samples", "128", "--batch-norm")
    assert proc.returncode == 1  # a non-equivalent row fails the bench, never passes
    ddp = json.loads(proc.stdout.strip().splitlines()[-1])["rows"][1]
    assert ddp["equivalent"] is False and ddp["max_param_diff"] > ddp["tolerance"]
    assert "BatchNorm2d" in ddp["reason"] and "SyncBatchNorm" in ddp["reason"]


def test_the_reason_names_what_the_model_holds():
    import torch

    facts = model_facts(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.1), torch.nn.BatchNorm1d(2)))
    assert facts == {"batch_dependent": ["BatchNorm1d"], "dropout": ["Dropout"]}
    assert model_facts(torch.nn.SyncBatchNorm(2)) == {"batch_dependent": [], "dropout": []}
    reason = explain(facts, 2, 1e-3, 1e-5)
    assert "BatchNorm1d" in reason and "Dropout with p > 0" in reason and "1.0e-03 > tolerance 1e-05" in reason
    assert "loss normalisation" in explain({"batch_dependent": [], "dropout": []}, 2, 1e-3, 1e-5)


@pytest.mark.parametrize(("argv", "message"), [
    (["--script", "missing.py"], "--script missing.py: no such file"),
    (["--script", "examples/causal_lm.py", "--strategies", "horovod"], "not started by `rankwise launch`"),
    (["--script", "examples/causal_lm.py", "--steps", "1"], "--steps must be at least 2"),
    (["extra"], "only --script takes arguments"),
])
def test_bad_script_flags_fail_before_anything_runs(argv, message, capsys, monkeypatch):
    from rankwise import cli

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("rankwise.tools.bench.script.run_bench", lambda *a, **k: pytest.fail("something ran"))
    assert cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
