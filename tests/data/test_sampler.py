import random

import pytest
import torch

from rankwise.sampling.batching import LengthGroupedSampler, OrderedShardSampler, longest_first


def lengths_of(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(3, 96) for _ in range(n)]


def sampler(lengths, group_size, world, rank, seed=7, epoch=0):
    s = LengthGroupedSampler(
        range(len(lengths)), lengths, group_size, num_replicas=world, rank=rank, seed=seed
    )
    s.set_epoch(epoch)
    return s


def per_rank_batches(lengths, group_size, world, micro):
    """Each rank's loader batches (consecutive `micro` indices of its shard)."""
    shards = [list(sampler(lengths, group_size, world, r)) for r in range(world)]
    return [[shard[i : i + micro] for i in range(0, len(shard), micro)] for shard in shards]


@pytest.mark.parametrize("world,accum", [(2, 1), (3, 1), (2, 2), (4, 2)])
def test_every_step_is_the_single_process_batch(world, accum):
    lengths = lengths_of(1001)
    global_batch = 24
    single = list(sampler(lengths, global_batch, 1, 0))
    single_steps = [
        sorted(single[i : i + global_batch]) for i in range(0, len(single), global_batch)
    ]
    ranks = per_rank_batches(lengths, global_batch, world, global_batch // world // accum)
    steps = []
    for step in range(len(single_steps)):
        micro_batches = range(step * accum, (step + 1) * accum)
        steps.append(sorted(i for r in range(world) for m in micro_batches for i in ranks[r][m]))
    assert steps == single_steps
    assert len(single_steps) == 1001 // global_batch  # the incomplete last batch is dropped


def test_batches_are_length_homogeneous_and_shuffled():
    lengths = lengths_of(4000)
    order = sampler(lengths, 32, 1, 0).global_order()
    batches = [order[i : i + 32] for i in range(0, len(order), 32)]
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches]
    assert sum(spread) / len(spread) < 10  # random batches of 3..96 spread about 85
    assert sorted(order) != order and len(set(order)) == len(order) == 4000 // 32 * 32
    padded = sum(max(lengths[i] for i in b) for b in batches) * 32
    assert padded < 1.2 * sum(lengths[i] for i in order)
    # Batch order is shuffled, not longest first across the epoch.
    first_lengths = [lengths[b[0]] for b in batches]
    assert first_lengths != sorted(first_lengths, reverse=True)


def test_epochs_and_seeds_change_the_order_and_ranks_agree():
    lengths = lengths_of(500)
    assert (
        sampler(lengths, 20, 2, 0, epoch=0).global_order()
        != sampler(lengths, 20, 2, 0, epoch=1).global_order()
    )
    assert (
        sampler(lengths, 20, 2, 0, seed=1).global_order()
        != sampler(lengths, 20, 2, 0, seed=2).global_order()
    )
    assert sampler(lengths, 20, 2, 0).global_order() == sampler(lengths, 20, 2, 1).global_order()
    assert (
        len(sampler(lengths, 20, 2, 1)) == len(list(sampler(lengths, 20, 2, 1))) == 500 // 20 * 10
    )


def test_rejects_mismatched_lengths_and_indivisible_batches():
    with pytest.raises(ValueError, match="3 lengths for a dataset of 4"):
        LengthGroupedSampler(range(4), [1, 2, 3], 2, num_replicas=1, rank=0)
    with pytest.raises(ValueError, match="not divisible by 2 ranks"):
        LengthGroupedSampler(range(4), [1, 2, 3, 4], 3, num_replicas=2, rank=0)


def test_runtime_loader_groups_by_the_step_batch():
    from rankwise.data.datasets import TokenizedTextDataset
    from rankwise.runtime import Runtime

    lengths = lengths_of(300)
    dataset = TokenizedTextDataset([[5] * n for n in lengths], [0] * 300)
    rt = Runtime("single", seed=3)
    loader = rt.loader(
        dataset, 8, lengths=dataset.lengths, group_size=16, collate_fn=dataset.collate
    )
    assert isinstance(loader.sampler, LengthGroupedSampler) and loader.sampler.group_size == 16
    widths = [batch["input_ids"].shape[1] for batch in loader]
    assert len(widths) == 300 // 16 * 2
    assert sum(widths) * 8 < 1.2 * sum(lengths)  # barely any padding
    with pytest.raises(ValueError, match="not a multiple"):
        rt.loader(dataset, 8, lengths=dataset.lengths, group_size=12)
    with pytest.raises(ValueError, match="shuffled training loader"):
        rt.loader(dataset, 8, shuffle=False, lengths=dataset.lengths)
    assert torch.equal(next(iter(loader))["input_ids"], next(iter(loader))["input_ids"])


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 7, 12])
def test_an_evaluation_order_is_shared_out_once_with_padding_repeats_only(world, n):
    lengths = lengths_of(n)
    order = longest_first(lengths)
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    shards = [list(OrderedShardSampler(order, world, rank)) for rank in range(world)]
    assert len({len(shard) for shard in shards}) <= 1  # every rank runs the same number of batches
    seen = [i for shard in shards for i in shard]
    # each once, fewer repeats than ranks
    assert sorted(set(seen)) == list(range(n)) and len(seen) - n < world
    # rank r takes every world-th of the order from r, then repeats
    for rank, shard in enumerate(shards):
        real = [order[position] for position in range(rank, n, world)]
        assert shard[: len(real)] == real and set(shard[len(real) :]) <= set(order[:world])
