"""rt.loader copies each batch to the device one batch ahead (``rankwise.runtime.prefetch``): the
copy of the next batch starts when one is handed out, ``rt.to_device`` takes the copies made for
its tensors, a tensor changed in place since is copied again, and the loader's position (a
checkpoint's) counts the batches handed out, not the one taken ahead.

On the CPU the copies go to the meta device, which copies shapes without data: the order of the
copies, the hand-over and the counts are what is tested; the side stream needs CUDA
(tests/gpu/test_prefetch.py)."""

from __future__ import annotations

import torch
from torch import nn

import rankwise
from rankwise.checkpoint.position import ResumableLoader
from rankwise.runtime.prefetch import DeviceAhead
from rankwise.sampling.batching import rank_sampler

SAMPLES, BATCH = 40, 4
META = torch.device("meta")


class Recorded(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.features = torch.arange(SAMPLES * 3, dtype=torch.float32).reshape(SAMPLES, 3)
        self.collated = 0

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        return {"x": self.features[index], "index": index}

    def collate(self, samples: list[dict]) -> dict:
        self.collated += 1
        return {
            "x": torch.stack([s["x"] for s in samples]),
            "index": torch.tensor([s["index"] for s in samples]),
        }


def loader(data: Recorded, prefetch: DeviceAhead | None) -> ResumableLoader:
    sampler = rank_sampler(data, BATCH, 1, 0, shuffle=True, drop_last=True, seed=3)
    return ResumableLoader(
        data,
        batch_size=BATCH,
        sampler=sampler,
        drop_last=True,
        collate_fn=data.collate,
        generator=torch.Generator().manual_seed(3),
        gather=lambda mine: [mine],
        say=None,
        world_size=1,
        ahead=None if prefetch is None else prefetch.ahead,
    )


def test_the_next_batch_is_copied_while_the_loop_has_this_one():
    data, prefetch = Recorded(), DeviceAhead(META)
    handed = []
    for k, batch in enumerate(loader(data, prefetch)):
        # this batch and the next one were built, the next one's copy started
        assert data.collated == min(k + 2, SAMPLES // BATCH)
        assert len(prefetch._in_flight) <= 2
        moved = prefetch.move(batch)
        assert moved["x"].device == META and moved["x"].shape == batch["x"].shape
        assert batch["x"].device.type == "cpu"  # the loop still has the host batch
        handed.append(batch["index"].tolist())
    assert prefetch.taken == 2 * SAMPLES // BATCH and prefetch.copied_again == 0
    assert not prefetch._copies  # the pass ended: no copy outlives it
    plain = [batch["index"].tolist() for batch in loader(Recorded(), None)]
    assert handed == plain  # the same batches in the same order


def test_a_batch_taken_apart_and_put_together_again_finds_its_copies():
    prefetch = DeviceAhead(META)
    batches = iter(loader(Recorded(), prefetch))  # (held: a pass left behind drops its copies)
    batch = next(batches)
    x, index = prefetch.move((batch["x"], batch["index"]))
    assert (x.device, index.device) == (META, META) and prefetch.taken == 2
    mine = torch.ones(2)  # not the loader's: copied now, not counted
    assert prefetch.move([mine])[0].device == META and prefetch.taken == 2


def test_a_tensor_changed_in_place_after_it_was_handed_out_is_copied_again():
    said: list[str] = []
    prefetch = DeviceAhead(META, say=said.append)
    batches = iter(loader(Recorded(), prefetch))
    edited = next(batches)
    edited["x"].mul_(2)  # in place: same tensor, one more write
    assert prefetch.move(edited)["x"].device == META
    assert (prefetch.taken, prefetch.copied_again) == (1, 1)  # "index" came from its copy
    replaced = next(batches)
    replaced["x"] = replaced["x"] + 1  # a new tensor: copied as it would be anyway
    prefetch.move(replaced)
    assert (prefetch.taken, prefetch.copied_again) == (2, 1)
    untouched = next(batches)
    prefetch.move(untouched)
    prefetch.move(untouched)  # a copy is handed over once; the second move copies anew
    assert (prefetch.taken, prefetch.copied_again) == (4, 1)
    assert len(said) == 1 and "copied again" in said[0] and "prefetch=False" in said[0]


def test_a_batch_the_loop_never_moved_holds_no_copy():
    prefetch = DeviceAhead(META)
    batches = iter(loader(Recorded(), prefetch))
    first = next(batches)
    next(batches)
    next(batches)
    assert len(prefetch._copies) == 4  # two tensors of the batch handed out last and the next
    prefetch.move(first)
    assert prefetch.taken == 0


def test_the_position_counts_the_batches_handed_out_not_the_one_taken_ahead():
    with_prefetch = loader(Recorded(), DeviceAhead(META))
    without = loader(Recorded(), None)
    for batches in (iter(with_prefetch), iter(without)):
        for _ in range(3):
            next(batches)
    recorded = with_prefetch.position()
    assert recorded == without.position()
    assert recorded["position"] == 3 * BATCH
    # resumed there, a loader hands out exactly what the uninterrupted one hands out next
    resumed = loader(Recorded(), DeviceAhead(META))
    resumed.resume(recorded, step_samples=BATCH)
    continuation = [batch["index"].tolist() for batch in resumed]
    uninterrupted = [batch["index"].tolist() for batch in loader(Recorded(), None)][3:]
    assert continuation == uninterrupted


def _train(checkpoints: str, phase: str, prefetch: bool) -> dict[str, torch.Tensor]:
    """A user's loop through rt.loader and rt.to_device: ``full`` (two epochs), ``first`` (saves
    after step 5 of the first epoch and stops) or ``resume``."""
    with rankwise.setup("single", seed=0) as rt:
        model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
        model, optimizer = rt.prepare(model, torch.optim.AdamW(model.parameters()))
        data = rt.loader(Recorded(), BATCH, collate_fn=Recorded().collate, prefetch=prefetch)
        start = rt.load_state(checkpoints, model, optimizer)["epoch"] if phase == "resume" else 0
        for epoch in range(start, 2):
            rt.set_epoch(data, epoch)
            for batch in data:
                batch = rt.to_device(batch)
                loss = model(batch["x"] / SAMPLES).square().mean()
                rt.backward(loss, model)
                rt.step(optimizer, model)
                rt.zero_grad(optimizer)
                if phase == "first" and rt.steps == 5:
                    rt.save_state(checkpoints, model, optimizer, extra={"epoch": epoch})
                    return {}
        moved = rt.steps - (5 if phase == "resume" else 0)
        assert rt.prefetch.taken == (2 * moved if prefetch else 0)  # a batch's two tensors
        return {k: v.clone() for k, v in rt.state_dict(model).items()}


def test_a_run_resumed_mid_epoch_with_the_prefetch_ends_bitwise_where_one_without_does(tmp_path):
    uninterrupted = _train(str(tmp_path / "none"), "full", prefetch=False)
    _train(str(tmp_path / "ckpt"), "first", prefetch=True)
    resumed = _train(str(tmp_path / "ckpt"), "resume", prefetch=True)
    assert uninterrupted.keys() == resumed.keys()
    for name, weight in uninterrupted.items():
        assert torch.equal(weight, resumed[name]), name
