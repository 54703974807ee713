import pytest
import torch
from sklearn.metrics import classification_report

from rankwise.data.datasets import FeatureDataset
from rankwise.models.toy_nets import LinearClassifier
from rankwise.train.evaluate import evaluate
from tests.support.multiproc import run_ranks

pytestmark = pytest.mark.multiproc  # every test here starts processes (ranks or commands)


def _dataset(n: int) -> FeatureDataset:
    g = torch.Generator().manual_seed(0)
    return FeatureDataset(torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g))


class _WithLengths(FeatureDataset):
    """Samples with a length each, as text datasets have: evaluation then runs longest first."""

    @property
    def lengths(self) -> list[int]:
        return [(i * 37) % 11 for i in range(len(self))]


def _evaluate(n: int, strategy: str, ordered: bool = False):
    import rankwise

    torch.manual_seed(0)
    model = LinearClassifier(6, 3)
    dataset = _dataset(n)
    if ordered:
        dataset = _WithLengths(dataset.features, dataset.labels)
    with rankwise.setup(strategy) as rt:
        model, _ = rt.prepare(model)
        # A batch of 64 does not divide by 3 ranks: rounded up per rank.
        result = evaluate(rt, model, dataset, ["x", "y", "z"], batch_size=64)
        return (
            result.samples,
            result.accuracy,
            result.macro_f1,
            result.report["z"]["support"],
            result.predictions.tolist(),
        )


@pytest.mark.parametrize("world_size", [2, 3])
def test_odd_sized_dataset_is_counted_exactly_once(world_size):
    n = 1001
    single = run_ranks(_evaluate, 1, n, "single")[0]
    for samples, accuracy, macro_f1, support, predictions in run_ranks(
        _evaluate, world_size, n, "ddp"
    ):
        assert samples == n, "padding duplicates or missing samples"
        assert (accuracy, macro_f1, support, predictions) == single[1:]


@pytest.mark.parametrize(("world_size", "strategy"), [(3, "ddp"), (2, "accelerate")])
def test_longest_first_evaluation_is_counted_exactly_once_and_in_index_order(world_size, strategy):
    n = 1001
    single = run_ranks(_evaluate, 1, n, "single")[0]
    for samples, accuracy, macro_f1, support, predictions in run_ranks(
        _evaluate, world_size, n, strategy, True
    ):
        assert samples == n
        assert (accuracy, macro_f1, support, predictions) == single[1:]


def test_report_matches_scikit_learn_on_one_process():
    samples, accuracy, macro_f1, support, predictions = run_ranks(_evaluate, 1, 101, "single")[0]
    labels = _dataset(101).labels
    report = classification_report(labels, predictions, output_dict=True, zero_division=0)
    assert accuracy == pytest.approx(report["accuracy"]) and macro_f1 == pytest.approx(
        report["macro avg"]["f1-score"]
    )
    assert support == (labels == 2).sum().item()
