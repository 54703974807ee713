"""The step-time breakdown's records (unit): what each producer writes has exactly the keys its
TypedDict declares (:mod:`rankwise.measure.records`), so a key added on one side only fails here;
mypy checks the readers' keys (:mod:`rankwise.tools.bench.why`) against the same types."""

from types import SimpleNamespace
from typing import get_type_hints

import torch

from rankwise.measure.records import Breakdown, ModelFacts, RankParts
from rankwise.measure.window_steps import RankWindow, WindowSteps
from rankwise.tools.watch import window
from rankwise.train.profiling import LoopProfile


class OneProcess:
    def barrier(self):
        pass

    def all_gather_object(self, obj):
        return [obj]


def declared(record_type) -> set[str]:
    return set(get_type_hints(record_type))


def profiled_loop(model):
    """Five real steps of ``model``: steps 2-3 timed, steps 4-5 profiled."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = LoopProfile(OneProcess(), steps=2, after=3, window_from=1)
    for step, batch in enumerate(loop.timed([torch.randn(8, 4) for _ in range(5)]), 1):
        with loop.mark("forward"):
            loss = model(batch).sum()
        with loop.mark("backward"):
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        loop.step_ended(step)
    return loop


def assert_has_the_declared_keys(breakdown):
    assert breakdown is not None
    assert set(breakdown) == declared(Breakdown)
    assert breakdown["ranks"] and all(set(r) == declared(RankParts) for r in breakdown["ranks"])
    assert breakdown["window"] is not None and set(breakdown["window"]) == declared(WindowSteps)
    assert all(set(r) == declared(RankWindow) for r in breakdown["window"]["ranks"])
    assert set(breakdown["facts"]) <= declared(ModelFacts)


def test_the_training_apps_breakdown_has_the_keys_of_its_record():
    model = torch.nn.Linear(4, 2)
    breakdown = profiled_loop(model).breakdown(model, "cpu", 0.001)
    assert_has_the_declared_keys(breakdown)
    assert breakdown["steps"] == [4, 5]


def test_a_watched_scripts_breakdown_has_the_keys_of_its_record():
    model = torch.nn.Linear(4, 2)
    loop = profiled_loop(model)
    assert loop.profile is not None
    watcher = SimpleNamespace(
        window=SimpleNamespace(profile=loop.profile),
        facts={"device": "cpu"},
        models=SimpleNamespace(live=lambda: [model]),
    )
    profiled = [(loop.profile.records(), loop.step_seconds, loop.data_seconds)]
    breakdown = window._breakdown(watcher, profiled, 0.001)
    assert_has_the_declared_keys(breakdown)
    assert breakdown["steps"] == [4, 5]
