"""The examples as users write them — library defaults: torch's Adam/AdamW epsilon, GPT-2's dropout
0.1, accumulation, clipping, a warm-up + cosine schedule — are proven equivalent by `rankwise
verify` under every strategy `rankwise launch` starts, at 2 ranks over gloo; over 50 steps too,
where rounding would have compounded. (The LM under every strategy, through `rankwise bench
--script`: tests/tools/bench/test_user_script.py.)"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from tests.support.cli import ROOT
from tests.support.strategies import strategies_for

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)

LM = ["--samples", "256", "--batch-size", "16", "--grad-accum", "2"]
CNN = ["--samples", "256", "--batch-size", "32"]
# every strategy `rankwise launch` starts (tests/support/strategies.py)
STRATEGIES = strategies_for("scripts")


def verify(
    out: Path, script: str, strategy: str, steps: int, script_args: list[str]
) -> tuple[int, str, dict]:
    """`rankwise verify` in this process (its runs are fresh processes): exit code, output,
    report."""
    from rankwise import cli

    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = cli.main(
            [
                "verify",
                str(ROOT / "examples" / script),
                "--strategy",
                strategy,
                "--steps",
                str(steps),
                "--out",
                str(out),
                "--",
                *script_args,
            ]
        )
    report = json.loads((out / "verify.json").read_text()) if (out / "verify.json").exists() else {}
    return code, text.getvalue(), report


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_cnn_at_its_optimizers_defaults_is_equivalent_under_every_strategy(
    optimizer, strategy, tmp_path
):
    code, output, report = verify(
        tmp_path, "image_cnn.py", strategy, 5, [*CNN, "--optimizer", optimizer]
    )
    assert code == 0, output[-4000:]
    candidate = json.loads((tmp_path / "candidate" / "probe.json").read_text())
    # as the launcher chose
    assert (candidate["strategy"], candidate["world_size"]) == (strategy, 2)
    assert [line["step"] for line in report["step_lines"]] == list(range(6))
    assert all(line["followed"] and line["equivalent"] for line in report["step_lines"][1:]), (
        report["step_lines"]
    )
    print(
        f"cnn {optimizer} {strategy}: largest gradient difference "
        f"{max(line['gradient_diff'] for line in report['step_lines'][1:]):.1e}"
    )


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_language_model_at_library_defaults_stays_equivalent_over_50_steps(strategy, tmp_path):
    code, output, report = verify(
        tmp_path, "causal_lm.py", strategy, 50, [*LM, "--samples", "1024", "--steps", "60"]
    )
    assert code == 0, output[-4000:]
    lines = report["step_lines"][1:]
    assert len(lines) == 50 and all(line["equivalent"] for line in lines)
    # GPT-2's own dropout, switched off to compare
    assert sum(len(m) for m in [report["dropout"]["modules"]]) == 7
    last = lines[-1]
    print(
        f"{strategy} step 50: gradient {last['gradient_diff']:.1e}, weights "
        f"{last['max_param_diff']:.1e}"
    )
    # Lockstep: rounding does not compound, so step 50 is no further apart than step 1.
    assert last["gradient_diff"] < 10 * max(lines[0]["gradient_diff"], 1e-7)
    assert "over steps 1-50: gradient difference" in output
    assert (tmp_path / "verify.png").read_bytes()[:4] == b"\x89PNG"
    assert "verify.png" in (tmp_path / "verify.md").read_text()
