"""The float-noise floor of verify's update criterion: ``rankwise verify --keep-weights`` on scripts
that are equivalent (fp32, 2 ranks against one process, in lockstep), and each step's relative
update difference (:func:`rankwise.measure.tolerance.update_difference`) with and without its
one-ulp allowance, per script; then, where ``--lr-factors`` is given, the smallest learning-rate
change the update criterion alone catches (a script run whose N ranks use lr x factor)::

    python scripts/update_noise.py --steps 6 --out /tmp/noise

Each case is a script with its arguments (``CASES``): SGD and AdamW, plain DDP, FSDP2, DeepSpeed
ZeRO-2, Accelerate, rankwise's own strategies on the tiny BERT (LayerNorm weights of 1.0, whose
ulp is 1.2e-7).  Prints one line per case: the largest relative difference over its steps with the
allowance (what the criterion reads) and without it.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

from rankwise.measure.tolerance import update_difference
from rankwise.tools.step_trace import weights_file

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "support" / "tools" / "watch" / "scripts"

CASES: dict[str, tuple[Path, tuple[str, ...], tuple[str, ...]]] = {
    # name: (script, verify flags, script arguments)
    "adamw ddp (torch)": (SCRIPTS / "plain_ddp.py", (), ()),
    "adamw accelerate": (SCRIPTS / "accelerate_tour.py", (), ()),
    "adamw fsdp2 (torch)": (SCRIPTS / "plain_fsdp2.py", (), ()),
    "adamw deepspeed zero-2": (SCRIPTS / "deepspeed_engine.py", (), ("--stage", "2")),
    "sgd+momentum ddp, OneCycleLR": (SCRIPTS / "image_classifier.py", (), ()),
    "sgd ddp tutorial": (SCRIPTS / "tutorial_ddp.py", (), ()),
    "adamw tiny BERT, rankwise ddp": (
        ROOT / "examples" / "builtin_model.py",
        ("--strategy", "ddp"),
        (),
    ),
    "adamw tiny BERT, rankwise fsdp": (
        ROOT / "examples" / "builtin_model.py",
        ("--strategy", "fsdp"),
        (),
    ),
    "adamw tiny BERT, rankwise deepspeed-zero2": (
        ROOT / "examples" / "builtin_model.py",
        ("--strategy", "deepspeed-zero2"),
        (),
    ),
    "adamw tiny BERT, rankwise deepspeed-zero3": (
        ROOT / "examples" / "builtin_model.py",
        ("--strategy", "deepspeed-zero3"),
        (),
    ),
    "adamw GPT-2 example, rankwise fsdp": (
        ROOT / "examples" / "causal_lm.py",
        ("--strategy", "fsdp"),
        (),
    ),
    "adamw GPT-2 example, rankwise deepspeed-zero2": (
        ROOT / "examples" / "causal_lm.py",
        ("--strategy", "deepspeed-zero2"),
        (),
    ),
}


def verify(out: Path, script: Path, flags: tuple[str, ...], args: tuple[str, ...], steps: int):
    from rankwise import cli

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(
            ["verify", str(script), "--steps", str(steps), "--out", str(out), "--keep-weights"]
            + list(flags)
            + ["--", *args]
        )
    return code, json.loads((out / "verify.json").read_text())


def noise(out: Path, report: dict) -> tuple[float, float]:
    """The largest relative update difference over the compared steps: with the one-ulp allowance,
    and without it (recomputed from the kept weights)."""
    from rankwise.checkpoint import read_weights

    withouts = []
    for line in report["step_lines"]:
        step = line["step"]
        if not step or not line.get("followed"):
            continue
        before = read_weights(weights_file(out / "candidate", step - 1))
        after = read_weights(weights_file(out / "candidate", step))
        mine = read_weights(weights_file(out / "reference", step))
        # (no allowance to speak of: as float64, whose ulp is 2e-16 of a weight)
        raw = update_difference(
            {k: v.double() for k, v in after.items()},
            {k: v.double() for k, v in mine.items()},
            {k: v.double() for k, v in before.items()},
            {k: v.double() for k, v in before.items()},
        )
        withouts.append(raw["difference"])
    withs = [
        line["update_diff"] for line in report["step_lines"] if line.get("update_diff") is not None
    ]
    return max(withs, default=float("nan")), max(withouts, default=float("nan"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="case names (substrings)")
    args = parser.parse_args(argv)
    for name, (script, flags, script_args) in CASES.items():
        if args.only and not any(part in name for part in args.only):
            continue
        out = args.out / name.replace(" ", "_").replace("/", "_")
        code, report = verify(out, script, flags, script_args, args.steps)
        with_allowance, without = noise(out, report)
        print(
            f"{name:34s} exit {code} {report['verdict']:>15s}: relative update difference "
            f"{with_allowance:.1e} (without the ulp allowance {without:.1e}) over "
            f"{len(report['step_lines']) - 1} steps",
            flush=True,
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
