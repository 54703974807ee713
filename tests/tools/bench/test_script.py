"""`rankwise bench --script`: a user's script, unchanged, under each strategy; real runs, honest verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]


def _bench(out: Path, script: str, strategies: str, *script_args: str) -> subprocess.CompletedProcess:
    path = ROOT / script if "/" in script else ROOT / "examples" / script
    return subprocess.run([sys.executable, "-m", "rankwise.cli", "bench", "--script", str(path),
                           "--strategies", strategies, "--steps", "4", "--out", str(out), "--json", "--",
                           *script_args], capture_output=True, text=True, timeout=900, cwd=out.parent)


STRATEGIES = ["ddp", "fsdp", "deepspeed-zero2", "deepspeed-zero3", "accelerate"]


def test_a_stock_language_model_passes_every_rows_equivalence_and_the_row_says_how_it_was_compared(tmp_path):
    """The GPT-2 example at library defaults (AdamW eps 1e-8, dropout 0.1, accumulation 2, clipping, warm-up +
    cosine): before the lockstep criterion every distributed row FAILed (7.7e-2 with dropout on, 2e-5 without)."""
    out = tmp_path / "lm"
    proc = _bench(out, "causal_lm.py", ",".join(STRATEGIES), "--samples", "256", "--batch-size", "16")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line["row"]: line for line in json.loads(proc.stdout.strip().splitlines()[-1])["rows"]}
    assert list(rows) == ["single", *STRATEGIES]
    assert rows["single"]["verdict"] == "reference"
    for name, line in rows.items():
        assert line["status"] == "ok", (name, line["status"])
        assert line["processes"] == (1 if name == "single" else 2)
        assert line["samples_per_s"] > 0 and line["speedup"] > 0 and len(line["peak_rss_mb"]) == line["processes"]
        if name != "single":
            assert line["verdict"] == "equivalent" and line["equivalent"] is True, (name, line)
            assert line["compared"] == "dropout off (7 modules)" and line["compared_steps"] == 5
            assert line["max_gradient_diff"] < line["gradient_tolerance"], (name, line)
    saved = json.loads((out / "report.json").read_text())
    assert [line["row"] for line in saved["rows"]] == list(rows)
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    assert "| fsdp | 2 |" in report and "throughput: the script as written; equivalence: `rankwise verify`" in report
    assert (out / "verify" / "fsdp" / "verify.json").exists()  # each row's own verify report, for the details


def test_batch_norm_under_ddp_is_not_equivalent_and_the_row_says_why(tmp_path):
    proc = _bench(tmp_path / "cnn", "image_cnn.py", "ddp", "--samples", "128", "--batch-norm")
    assert proc.returncode == 1  # a non-equivalent row fails the bench, never passes
    ddp = json.loads(proc.stdout.strip().splitlines()[-1])["rows"][1]
    assert ddp["verdict"] == "not equivalent" and ddp["equivalent"] is False
    assert ddp["max_gradient_diff"] > ddp["gradient_tolerance"]
    assert "BatchNorm2d" in ddp["reason"] and "SyncBatchNorm" in ddp["reason"]
    assert "ddp: the model has BatchNorm2d" in proc.stdout


def test_a_plain_data_loader_is_counted_from_what_reached_the_model_and_never_passes(tmp_path):
    """Each rank iterates every sample: before, the row read "None samples/s", 0 samples/s and `pass`."""
    proc = _bench(tmp_path / "plain", "tests/tools/verify_cases.py", "ddp", "--case", "plain-loader")
    assert proc.returncode == 1, proc.stderr[-3000:]
    single, ddp = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    assert single["samples_per_s"] > 0 and ddp["samples_per_s"] > 0  # counted through rt.to_device
    assert ddp["verdict"] == "not equivalent" and "each of the 2 ranks saw the same 16 samples" in ddp["reason"]
    log = (tmp_path / "plain" / "runs" / "ddp-0" / "bench.log").read_text()
    assert log.count("all 2 ranks trained on the same 16 samples in the first step") == 1  # the Runtime's warning


def test_random_ops_that_cannot_be_switched_off_make_a_row_not_comparable_neither_pass_nor_fail():
    from rankwise.tools.bench.script import ScriptRow, summarize, table

    run = {"steady_samples_per_s": 10.0, "wall_s": 1.0, "precision": "32-true", "peak_rss_mb": [1.0],
           "cuda_max_allocated_mb": [None], "samples_counted_by": "rt.to_device"}
    report = {"verdict": "not comparable", "steps": [{"step": 0, "max_param_diff": 0.0},
                                                    {"step": 1, "max_param_diff": 0.0, "gradient_diff": 0.4}],
              "dropout": {"modules": []}, "diagnosis": ["the forward drew random numbers (dropout in Net)"],
              "failure": {}, "tolerance": 1e-5, "gradient_tolerance": 5e-5}
    summary = summarize([ScriptRow("single", 1), ScriptRow("ddp", 2)],
                        {"single": [run], "ddp": [run | {"peak_rss_mb": [1.0, 1.0]}]}, {"ddp": report})
    ddp = summary["rows"][1]
    assert ddp["verdict"] == "not comparable" and ddp["equivalent"] is None
    assert "| not comparable |" in table(summary) and "FAIL" not in table(summary)
    assert "dropout in Net" in ddp["reason"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--script", "missing.py"], "--script missing.py: no such file"),
    (["--script", "examples/causal_lm.py", "--strategies", "horovod"], "not started by `rankwise launch`"),
    (["--script", "examples/causal_lm.py", "--steps", "1"], "--steps must be at least 2"),
    (["--script", "examples/causal_lm.py", "--verify-steps", "0"], "--verify-steps must be at least 1"),
    (["extra"], "only --script takes arguments"),
])
def test_bad_script_flags_fail_before_anything_runs(argv, message, capsys, monkeypatch):
    from rankwise import cli

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("rankwise.tools.bench.script.run_bench", lambda *a, **k: pytest.fail("something ran"))
    assert cli.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err
