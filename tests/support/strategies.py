"""What several strategy tests share: the runs they train on ranks, the data they prepare, the
contract checks and the export check.  (Fixtures over these: tests/strategies/conftest.py.)"""

import inspect
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rankwise.checkpoint import read_weights
from rankwise.data.prepare import PreparedData, prepare_data
from rankwise.models import model_from_spec, reads_ngrams
from rankwise.train.artifacts import export, load_checkpoint
from rankwise.train.config import DataConfig, build_config
from rankwise.train.evaluate import gather_predictions

# -- which strategies a test runs: derived from the registry ---------------------------------------
# A new strategy file (one @register class in src/rankwise/strategies/) is in every list below
# without editing a test: the equivalence, resume, public-loop, agreement and example-script tests
# run it, and test_contract.py checks its class (tests/strategies/test_registry.py shows it).  What
# a test leaves out, and why, is said here only.

REFERENCE = "single"
"""The one-process run every test compares with: never in a list of strategies under test."""
HOROVOD = (
    "started by horovodrun, not as tests.support.multiproc's ranks or by `rankwise launch`: "
    "tests/strategies/test_horovod.py"
)


@dataclass(frozen=True)
class Coverage:
    """Which registered strategies a group of tests runs."""

    one_process: bool = False
    """Also the one-process strategies (``multiprocess = False``) other than the reference."""
    as_variants: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """A strategy run as these registered names instead of its own (DeepSpeed as its ZeRO
    stages)."""
    left_out: Mapping[str, str] = field(default_factory=dict)
    """Registered strategies these tests do not run -> why, and where they are covered instead."""

    def names(self) -> list[str]:
        """The registered names to parametrise over, strategy by strategy in the registry's
        order."""
        from rankwise.strategies import lookup, strategy_names

        classes = sorted({lookup(name).cls for name in strategy_names()}, key=lambda cls: cls.name)
        names: list[str] = []
        for cls in classes:
            if (
                cls.name == REFERENCE
                or cls.name in self.left_out
                or not (cls.multiprocess or self.one_process)
            ):
                continue
            variants = self.as_variants.get(cls.name, (cls.name,))
            assert all(lookup(name).cls is cls for name in variants), (cls.name, variants)
            names.extend(variants)
        return names


COVERAGE = {
    # tests/strategies/test_equivalence.py: 2 ranks match one process (cases, accumulation,
    # clipping).  DeepSpeed at its default (ZeRO-2) and ZeRO-3, which also shards the parameters;
    # stages 0 and 1 in their own test there.
    "equivalence": Coverage(
        as_variants={"deepspeed": ("deepspeed", "deepspeed-zero3")},
        left_out={"horovod": HOROVOD, "dp": "one process: tests/strategies/test_dp_precision.py"},
    ),
    # tests/strategies/test_resume.py: a cut run resumed ends bitwise equal.  ZeRO-2 resumes in the
    # DeepSpeed regrouping cases there.
    "resume": Coverage(
        as_variants={"deepspeed": ("deepspeed-zero3",)},
        left_out={
            "horovod": HOROVOD,
            "dp": "one process: tests/runtime/test_runtime.py resumes it",
        },
    ),
    # tests/runtime/test_runtime.py: the public API's loop, every stage of DeepSpeed.
    "public loop": Coverage(
        one_process=True,
        as_variants={"deepspeed": tuple(f"deepspeed-zero{s}" for s in range(4))},
        left_out={
            "horovod": "its own test, started as a script: test_runtime.py::"
            "test_horovod_public_loop"
        },
    ),
    # tests/runtime/test_agreement.py: a model each rank drew alone trains from rank 0's weights.
    # The strategies that broadcast or shard differently: DDP's broadcast, FSDP's and ZeRO-3's
    # sharded parameters.
    "agreement": Coverage(
        as_variants={"deepspeed": ("deepspeed-zero3",)},
        left_out={
            "horovod": HOROVOD,
            "dp": "one process: nothing to agree on",
            "accelerate": "not run, for the suite's time: Accelerate wraps torch's DDP, whose "
            "broadcast the ddp case checks",
        },
    ),
    # tests/examples/test_own_scripts.py (rankwise verify) and tests/tools/bench/test_user_script.py
    # (rankwise bench --script): the example scripts under every strategy `rankwise launch` starts.
    "scripts": Coverage(
        as_variants={"deepspeed": ("deepspeed-zero2", "deepspeed-zero3")},
        left_out={
            "horovod": "`rankwise launch` does not start it: horovodrun scripts in "
            "tests/tools/watch/test_horovod_scripts.py",
            "dp": "one process",
        },
    ),
}


def strategies_for(tests: str) -> list[str]:
    """The registered strategy names a group of tests (a key of COVERAGE) runs."""
    return COVERAGE[tests].names()


# -- the equivalence runs: one small model per case, 6 steps at seed 7 -----------------------------


CASE_DEFAULTS = (
    "seed=7",
    "max_steps=6",
    "log_every=2",
    "eval_batch_size=64",
    "progress=false",
    "model.dropout=0.0",
)
"""What every strategy case trains with, before its own overrides."""


def train_case(run_dir: str, data_dir: str, overrides: list[str]) -> tuple[int, int]:
    """Train on this rank; returns (optimizer steps, world size as the strategy's own library sees
    it)."""
    from rankwise.train.loop import run_training

    cfg = build_config(overrides=[*CASE_DEFAULTS, *overrides])
    summary = run_training(cfg, PreparedData.load(data_dir), run_dir)
    return summary["steps"], summary["library_world_size"]


def case_weights(run_dir):
    return read_weights(run_dir / "checkpoints" / "latest")


CASES = {
    "toy-mlp": ("toy", ["model.name=mlp", "data.source=toy"]),
    "tiny-bert": ("text", ["model.name=tiny", "data.max_length=32"]),
}


def prepare_case_data(root: Path) -> Path:
    """The toy and text datasets of CASES, under ``root``."""
    prepare_data(DataConfig(source="toy", toy_samples=1024)).save(root / "toy")
    prepare_data(
        DataConfig(source="sentiment", tokenizer="char", vocab_size=3000, max_length=32, limit=400)
    ).save(root / "text")
    return root


# -- resuming: the toy MLP, 8 steps with a checkpoint every 4 --------------------------------------


def train_toy(run_dir: str, data_dir: str, strategy: str, *extra: str) -> None:
    from rankwise.train.loop import run_training

    cfg = build_config(
        overrides=[
            f"strategy={strategy}",
            "model.name=mlp",
            "data.source=toy",
            "batch_size=16",
            "max_steps=8",
            "save_every=4",
            "progress=false",
            "seed=5",
            *extra,
        ]
    )
    run_training(cfg, PreparedData.load(data_dir), run_dir)


def cut_back(checkpoints: Path, last: str, keep: str) -> dict:
    """Pretend the run died after checkpoint ``keep``: drop ``last`` (returning its weights), point
    latest back."""
    final = read_weights(checkpoints / last)
    shutil.rmtree(checkpoints / last)
    os.remove(checkpoints / "latest")
    os.symlink(keep, checkpoints / "latest")
    return final


def prepare_toy(root: Path) -> Path:
    prepare_data(DataConfig(source="toy", toy_samples=800)).save(root)
    return root


# -- the strategy contract -------------------------------------------------------------------------


def _function(member):
    """The function a class member's ``@override`` marks (a property's getter, a classmethod's
    function)."""
    if isinstance(member, property):
        return member.fget
    if isinstance(member, (classmethod, staticmethod)):
        return member.__func__
    return member


def redefined(cls: type) -> dict[str, object]:
    """The methods and properties ``cls`` defines itself that one of its bases defines too."""
    bases = cls.__mro__[1:]
    return {
        name: member
        for name, member in vars(cls).items()
        if inspect.isfunction(_function(member))
        and not name.startswith("__")
        and any(name in vars(base) for base in bases)
    }


def unmarked_overrides(cls: type) -> list[str]:
    return sorted(
        name
        for name, member in redefined(cls).items()
        if not getattr(_function(member), "__override__", False)
    )


def overrides_of_nothing(cls: type) -> list[str]:
    """Members marked ``@override`` that no base defines."""
    bases = cls.__mro__[1:]
    return sorted(
        name
        for name, member in vars(cls).items()
        if getattr(_function(member), "__override__", False)
        and not any(name in vars(b) for b in bases)
    )


# -- export ----------------------------------------------------------------------------------------


def assert_export_reproduces_the_runs_predictions(run_dir: Path, data_dir: Path, out: Path) -> None:
    """Export the run's latest checkpoint, load it into a plain model in this process, and predict
    the run's evaluation split: the predictions must be the run's own, and the run must have
    counted every sample exactly once."""
    import rankwise

    exported = export(run_dir / "checkpoints" / "latest", out / "model.safetensors")
    loaded = load_checkpoint(exported)
    model = model_from_spec(loaded.model_spec)
    model.load_state_dict(loaded.weights)  # strict: every key present, no module. prefix

    data = PreparedData.load(data_dir)
    split = "test" if data.size("test") else "dev"
    dataset = data.dataset(split, ngrams=reads_ngrams(loaded.model_spec))
    with rankwise.setup("single") as rt:
        predictions, _ = gather_predictions(
            rt, model, dataset, 64, getattr(dataset, "collate", None)
        )
    names = loaded.label_names
    run_predictions = [
        json.loads(line)["prediction"]
        for line in (run_dir / "predictions.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert len(run_predictions) == len(dataset)  # exact evaluation count under this strategy
    assert [names[i] for i in predictions.tolist()] == run_predictions
