"""FSDP2's per-rank chunks made when read (``compat.fsdp_tools.RankChunks``): the same views, in the
same storage at the same offsets, as torch's ``_chunk_with_empty`` makes all at once."""

from __future__ import annotations

import pytest
import torch

from rankwise.compat.fsdp_tools import RankChunks, chunks_when_read

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("shape", "n"),
    [((10, 3), 4), ((3, 5), 8), ((0,), 4), ((7,), 7), ((16, 2), 512), ((1,), 2), ((128, 4), 64)],
)
def test_each_chunk_is_the_view_torch_makes(shape, n):
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    tensor = torch.randn(*shape)
    made, read = _chunk_with_empty(tensor, n, dim=0), RankChunks(tensor, n, 0)
    assert len(read) == len(made) == n
    for index in [*range(n), -1]:
        a, b = made[index], read[index]
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype), index
        if a.numel():
            assert a.storage_offset() == b.storage_offset()
            assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert [c.shape for c in read[1:3]] == [c.shape for c in made[1:3]]
    with pytest.raises(IndexError):
        read[n]


def test_fully_shard_keeps_the_same_shard_with_chunks_made_when_read():
    """On a fake process group of 64 ranks, a parameter's local shard and its padded size are the
    ones torch's own chunks give."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from rankwise.compat.fsdp_tools import fake_store

    dist.init_process_group("fake", store=fake_store()(), rank=0, world_size=64)
    try:
        mesh = init_device_mesh("cpu", (64,))
        shards = []
        for patched in (False, True):
            torch.manual_seed(0)
            model = torch.nn.Linear(100, 7)
            with chunks_when_read() if patched else torch.no_grad():
                fully_shard(model, mesh=mesh)
            shards.append([(p.to_local().shape, p.to_local().clone()) for p in model.parameters()])
        for (shape_a, a), (shape_b, b) in zip(*shards):
            assert shape_a == shape_b and torch.equal(a, b)
    finally:
        dist.destroy_process_group()
