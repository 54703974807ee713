import pytest
import torch
from sklearn.metrics import classification_report

from rankwise.data.datasets import FeatureDataset
from rankwise.models.toy import LinearClassifier
from rankwise.train.evaluate import evaluate
from tests.multiproc import run_ranks


def _dataset(n: int) -> FeatureDataset:
    g = torch.Generator().manual_seed(0)
    return FeatureDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


def _evaluate(n: int, strategy: str):
    import rankwise

    torch.manual_seed(0)
    model = LinearClassifier(6, 3)
    with rankwise.setup(strategy) as rt:
        model, _ = rt.prepare(model)
        # A batch of 64 does not divide by 3 ranks: rounded up per rank.
        result = evaluate(rt, model, _dataset(n), ["x", "y", "z"], batch_size=64)
        return result.samples, result.accuracy, result.macro_f1, result.report["z"]["support"], \
            result.predictions.tolist()


@pytest.mark.parametrize("world_size", [2, 3])
def test_odd_sized_dataset_is_counted_exactly_once(world_size):
    n = 1001
    single = run_ranks(_evaluate, 1, n, "single")[0]
    for samples, accuracy, macro_f1, support, predictions in run_ranks(_evaluate, world_size, n, "ddp"):
        assert samples == n, "padding duplicates or missing samples"
        assert (accuracy, macro_f1, support, predictions) == single[1:]


def test_report_matches_scikit_learn_on_one_process():
    samples, accuracy, macro_f1, support, predictions = run_ranks(_evaluate, 1, 101, "single")[0]
    labels = _dataset(101).labels
    report = classification_report(labels, predictions, output_dict=True, zero_division=0)
    assert accuracy == pytest.approx(report["accuracy"]) and macro_f1 == pytest.approx(report["macro avg"]["f1-score"])
    assert support == (labels == 2).sum().item()
