"""What several strategy tests share: the runs they train on ranks, the data they prepare, the contract checks and
the export check.  (Fixtures over these: tests/strategies/conftest.py.)"""

import inspect
import json
import os
import shutil
from pathlib import Path

from rankwise.checkpoint import read_weights
from rankwise.data.prepare import PreparedData, prepare_data
from rankwise.models import model_from_spec, reads_ngrams
from rankwise.train.artifacts import export, load_checkpoint
from rankwise.train.config import DataConfig, build_config
from rankwise.train.evaluate import gather_predictions

# -- the equivalence runs: one small model per case, 6 steps at seed 7 ------------------------------------------

def train_case(run_dir: str, data_dir: str, overrides: list[str]) -> tuple[int, int]:
    """Train on this rank; returns (optimizer steps, world size as the strategy's own library sees it)."""
    from rankwise.train.loop import run_training

    cfg = build_config(overrides=["seed=7", "max_steps=6", "log_every=2", "eval_batch_size=64", "progress=false",
                                  "model.dropout=0.0", *overrides])
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
    prepare_data(DataConfig(source="sentiment", tokenizer="char", vocab_size=3000, max_length=32, limit=400)).save(
        root / "text")
    return root


# -- resuming: the toy MLP, 8 steps with a checkpoint every 4 ---------------------------------------------------

def train_toy(run_dir: str, data_dir: str, strategy: str, *extra: str) -> None:
    from rankwise.train.loop import run_training

    cfg = build_config(overrides=[f"strategy={strategy}", "model.name=mlp", "data.source=toy", "batch_size=16",
                                  "max_steps=8", "save_every=4", "progress=false", "seed=5", *extra])
    run_training(cfg, PreparedData.load(data_dir), run_dir)


def cut_back(checkpoints: Path, last: str, keep: str) -> dict:
    """Pretend the run died after checkpoint ``keep``: drop ``last`` (returning its weights), point latest back."""
    final = read_weights(checkpoints / last)
    shutil.rmtree(checkpoints / last)
    os.remove(checkpoints / "latest")
    os.symlink(keep, checkpoints / "latest")
    return final



def prepare_toy(root: Path) -> Path:
    prepare_data(DataConfig(source="toy", toy_samples=800)).save(root)
    return root


# -- the strategy contract --------------------------------------------------------------------------------------

def _function(member):
    """The function a class member's ``@override`` marks (a property's getter, a classmethod's function)."""
    if isinstance(member, property):
        return member.fget
    if isinstance(member, (classmethod, staticmethod)):
        return member.__func__
    return member


def redefined(cls: type) -> dict[str, object]:
    """The methods and properties ``cls`` defines itself that one of its bases defines too."""
    bases = cls.__mro__[1:]
    return {name: member for name, member in vars(cls).items()
            if inspect.isfunction(_function(member)) and not name.startswith("__")
            and any(name in vars(base) for base in bases)}


def unmarked_overrides(cls: type) -> list[str]:
    return sorted(name for name, member in redefined(cls).items()
                  if not getattr(_function(member), "__override__", False))


def overrides_of_nothing(cls: type) -> list[str]:
    """Members marked ``@override`` that no base defines."""
    bases = cls.__mro__[1:]
    return sorted(name for name, member in vars(cls).items()
                  if getattr(_function(member), "__override__", False) and not any(name in vars(b) for b in bases))


# -- export ----------------------------------------------------------------------------------------------

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
        predictions, _ = gather_predictions(rt, model, dataset, 64, getattr(dataset, "collate", None))
    names = loaded.label_names
    run_predictions = [json.loads(line)["prediction"]
                       for line in (run_dir / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(run_predictions) == len(dataset)  # exact evaluation count under this strategy
    assert [names[i] for i in predictions.tolist()] == run_predictions
