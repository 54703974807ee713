"""A tool's observer sees every point of a loop on the Runtime, in order, and can end the loop
cleanly."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import rankwise
from rankwise.runtime import observers


class Recorder(observers.Observer):
    def __init__(self, stop_at: int | None = None):
        self.seen: list[str] = []
        self.stop_at = stop_at

    def prepared(self, rt, model, grad_accum):
        self.seen.append(f"prepared accum={grad_accum}")

    def loader(self, rt, global_batch, shuffle):
        self.seen.append(f"loader {global_batch} shuffle={shuffle}")

    def batch(self, rt, batch):
        self.seen.append(f"batch {len(batch[0])}")

    def backward(self, rt, loss):
        self.seen.append("backward")

    def before_step(self, rt, model, optimizer):
        self.seen.append("before_step")

    def stepped(self, rt, model):
        self.seen.append(f"stepped {rt.steps}")
        if rt.steps == self.stop_at:
            raise observers.Finished()

    def ended(self, rt):
        self.seen.append("ended")


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setattr(observers, "_registered", [])
    return observers


def _loop(rt, steps: int = 2) -> None:
    data = TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    model = nn.Linear(4, 2)
    model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters()))
    loader = rt.loader(data, 4)
    for x, y in list(loader)[:steps]:
        x, y = rt.to_device((x, y))
        rt.backward(nn.functional.cross_entropy(model(x), y), model)
        rt.step(optimizer, model)
        rt.zero_grad(optimizer)


def test_an_observer_sees_each_point_of_the_loop_in_order(registered):
    recorder = Recorder()
    registered.register(recorder)
    with rankwise.setup("single") as rt:
        _loop(rt)
    assert recorder.seen == [
        "prepared accum=1",
        "loader 4 shuffle=True",
        *["batch 4", "backward", "before_step", "stepped 1"],
        *["batch 4", "backward", "before_step", "stepped 2"],
        "ended",
    ]


def test_an_observer_ends_the_script_cleanly_and_nothing_is_watched_without_one(registered):
    recorder = Recorder(stop_at=1)
    registered.register(recorder)
    with pytest.raises(observers.Finished) as finished, rankwise.setup("single") as rt:
        _loop(rt)
    assert (
        finished.value.code == 0
        and recorder.seen[-1] == "stepped 1"
        and "ended" not in recorder.seen
    )
    registered._registered.clear()
    with rankwise.setup("single") as rt:
        assert rt.observers == []
